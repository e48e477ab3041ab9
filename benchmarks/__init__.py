"""The benchmark harness: ``python -m benchmarks.run`` (see benchmarks/run.py)."""
