"""Loom's example suites: each a package runnable as ``python -m examples.<name>``."""
