"""Side-by-side benchmarks of Loom against its peers (DBOS Transact, LangGraph).

``python -m bench.peers`` (or ``python bench/run.py``) runs the same workloads on every system
and backend in one invocation and prints a table; see ``bench/README.md``. This package keeps its
imports light on purpose: the recovery children import only the one adapter they need, and the
time they take to start is part of what is measured.
"""
