"""Runnable examples; each module is also importable so tests and benchmarks reuse its model and data."""
