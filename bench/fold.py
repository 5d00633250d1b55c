"""The fold on its own: microseconds per event to replay a log, and to build-and-apply the
events a step writes (the driver's hot path), with nothing else in the loop.

    python bench/fold.py [--events 20000] [--rounds 7]

CPU time (process_time), not wall time: the figure is the interpreter's work, which a busy
machine's scheduling does not inflate. Uses only the public API, so the same script measures
any version of Loom (point PYTHONPATH at another checkout's src/ to compare).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import loom
from loom.model import EventType, apply_event


def make_log(events: int) -> list[loom.Envelope]:
    log = [
        loom.Envelope.create(
            "b",
            0,
            EventType.EXECUTION_STARTED,
            {"flow_id": "f", "input": None},
            fence=1,
            recorded_at=1.0,
        )
    ]
    for seq in range(1, events):
        payload: dict[str, Any] = {
            "position": seq,
            "step_id": "noop",
            "attempt": 1,
            "output": None,
            "started_at": 1.0,
        }
        log.append(
            loom.Envelope.create(
                "b", seq, EventType.STEP_COMPLETED, payload, fence=1, recorded_at=1.0
            )
        )
    return log


def replay_us(events: int) -> float:
    # Fresh envelopes each round: nothing decoded by an earlier round is reused.
    log = make_log(events)
    start = time.process_time()
    loom.replay(log)
    return (time.process_time() - start) / events * 1e6


def write_path_us(events: int) -> float:
    """What the driver does per step: build the record, encode it, fold it."""
    typed = getattr(loom.Envelope, "of", None)
    state = loom.replay(make_log(1))
    start = time.process_time()
    for seq in range(1, events):
        if typed is not None:
            from loom.model import StepCompleted

            env = typed(
                "b", seq, StepCompleted(seq, "noop", 1, None, 1.0), fence=1, recorded_at=1.0
            )
        else:
            env = loom.Envelope.create(
                "b",
                seq,
                EventType.STEP_COMPLETED,
                {
                    "position": seq,
                    "step_id": "noop",
                    "attempt": 1,
                    "output": None,
                    "started_at": 1.0,
                },
                fence=1,
                recorded_at=1.0,
            )
        apply_event(state, env)
    return (time.process_time() - start) / (events - 1) * 1e6


def main(events: int, rounds: int) -> None:
    replays = [replay_us(events) for _ in range(rounds)]
    writes = [write_path_us(events) for _ in range(rounds)]
    print(f"\nFold CPU cost, {events} STEP_COMPLETED events, {rounds} rounds (min, median)")
    print("| path | us/event |")
    print("|---|---|")
    for name, xs in (("replay (decode + reduce)", replays), ("build + encode + apply", writes)):
        print(f"| {name} | {min(xs):.2f} ({statistics.median(xs):.2f}) |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    main(args.events, args.rounds)
