"""Every fault point at every hit inside the agent loop: `python -m tests.agent_chaos`.

For each named fault point and each phase (the start process, which runs turns 1-2 up to the
refund's approval gate, and the vote process, which runs the refund and turn 3), kill the
process at hit 1, 2, ... until the point is no longer reached; each run is then recovered and
voted on in fresh processes. Checks per run: the conversation ends the same, each model turn
is called once (twice only when the kill fell between the provider's answer and its record),
and at most one tool effect ran twice. Prints a table; exits non-zero on any violation.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

from loom.faults import FAULT_POINTS
from tests.agents.test_agent_crash import CLEAN, FINAL, run_to_the_end


def main() -> int:
    runs: Counter[str] = Counter()
    bad: list[str] = []
    for phase in ("start", "vote"):
        for point in FAULT_POINTS:
            hit = 1
            while hit <= 12:
                with tempfile.TemporaryDirectory() as tmp:
                    killed, counts, output = run_to_the_end(Path(tmp), f"{point}=kill@{hit}", phase)
                if not killed:
                    break
                runs[f"{phase}:{point}"] += 1
                model_twice = [k for k, v in counts.items() if k.startswith("model:") and v > 1]
                tools_twice = [k for k, v in counts.items() if not k.startswith("model:") and v > 1]
                where = f"{phase}:{point}@{hit}"
                if output != FINAL or set(counts) != set(CLEAN):
                    bad.append(f"{where}: ended {output!r} with {counts}")
                if len(model_twice) + len(tools_twice) > 1 or any(v > 2 for v in counts.values()):
                    bad.append(f"{where}: more than the interrupted effect repeated: {counts}")
                hit += 1
    print(f"{'phase:point':<48}{'kills':>6}")
    for name, n in sorted(runs.items()):
        print(f"{name:<48}{n:>6}")
    print(f"{sum(runs.values())} kills, {len(bad)} violations")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
