"""pytest plugin: only restore the torch compat stubs, so thunder's suites run with
thunder's own executors (the baseline our failures are compared with)."""

import thunder_fuser  # noqa: F401
