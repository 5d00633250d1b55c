"""Run the side-by-side peer benchmark: ``python bench/run.py [--quick] [--only loom] ...``.

The same as ``python -m bench.peers`` from the repository root; see ``bench/README.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.peers.cli import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
