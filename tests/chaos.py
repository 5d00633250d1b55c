"""Long crash runs: `python -m tests.chaos --n 200`.

Enumerates every fault point at every hit count a five-step flow reaches (until the child
completes without being killed), then runs ``--n`` random (point, hit) kills, recovering each
from a fresh process and checking the invariants. Prints a per-point report.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from pathlib import Path

from loom.faults import FAULT_POINTS
from tests.crash_harness import crash_and_recover

POINTS = [p for p in FAULT_POINTS if p != "after_suspend_recorded"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="random kills after the enumeration")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    runs: Counter[str] = Counter()
    twice: Counter[str] = Counter()
    max_hit: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for point in POINTS:
            hit = 1
            while True:
                outcome = crash_and_recover(work, point, hit)
                runs[point] += 1
                twice[point] += sum(1 for n in outcome.counts.values() if n == 2)
                if not outcome.killed:
                    max_hit[point] = hit - 1
                    break
                hit += 1
        for i in range(args.n):
            point = rng.choice(POINTS)
            hit = rng.randint(1, max(1, max_hit[point]))
            sub = work / f"rand-{i}"
            sub.mkdir()
            outcome = crash_and_recover(sub, point, hit)
            runs[point] += 1
            twice[point] += sum(1 for n in outcome.counts.values() if n == 2)
    print(
        f"{'fault point':32s} {'runs':>6s} {'hits':>5s} {'lost':>5s} {'dup steps':>9s} "
        f"{'effects run twice':>17s}"
    )
    for point in POINTS:
        print(f"{point:32s} {runs[point]:6d} {max_hit[point]:5d} {0:5d} {0:9d} {twice[point]:17d}")
    print(
        f"total runs: {sum(runs.values())}; every run recovered to completed with dense, "
        "single-writer logs (any violation raises)"
    )


if __name__ == "__main__":
    main()
