"""Optimizer steps through thunder: ``thunder.jit(optimizer.step, executors=...)`` for
torch's ``Adam``, ``AdamW`` and ``SGD`` (``jitted_step.py``), their updates as thunder
traces them (``updates.py``)."""
