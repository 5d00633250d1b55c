"""The printed table, the Loom targets (reported, never asserted), the JSON and the PNG chart."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.config import WORKLOADS
from bench.peers.stats import Series

__all__ = ["Target", "evaluate_targets", "render_table", "write_chart", "write_json"]

COLUMNS = ("loom", "dbos", "langgraph", "floor")
HEADERS = {"loom": "Loom", "dbos": "DBOS", "langgraph": "LangGraph", "floor": "raw floor"}
ROWS = (
    "per_step",
    "per_step_floor_ratio",
    "per_step_above_floor",
    "throughput",
    "throughput_steps",
    "one_step",
    "recovery",
    "recovery_reexec",
    "gate",
)
LABELS = {
    "per_step": "per-step overhead µs/step ↓",
    "per_step_floor_ratio": "  ÷ floor run alongside ↓",
    "per_step_above_floor": "  above floor run alongside µs ↓",
    "throughput": "3-step workflows/s ↑",
    "throughput_steps": "3-step steps/s ↑",
    "one_step": "1-step workflows/s ↑",
    "recovery": "recovery spawn→done ms ↓",
    "recovery_reexec": "re-executed done steps ↓",
    "gate": "gate resume→done ms ↓",
}
BACKEND_TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


Index = dict[tuple[str, str], dict[str, Any]]


def index(results: list[dict[str, Any]]) -> Index:
    return {(r["system"], r["backend"]): r for r in results}


def series(idx: Index, system: str, backend: str, key: str) -> Series | None:
    res = idx.get((system, backend))
    if res is None or res.get("status") != "ok":
        return None
    data = res["workloads"].get(key)
    return Series.from_dict(data) if data else None


def _cell(idx: Index, system: str, backend: str, key: str) -> str:
    res = idx.get((system, backend))
    if res is None:
        return "not run"
    if res.get("status") == "skipped":
        return "skipped"
    if res.get("status") == "error":
        return "error"
    s = series(idx, system, backend, key)
    if s is None:
        return "—"
    if s.error or s.median is None:
        return "error"
    text = f"{num(s.median)} [{num(s.low)}..{num(s.high)}]"
    if system != "loom" and key not in (
        "recovery_reexec",
        "per_step_floor_ratio",
        "per_step_above_floor",
    ):
        loom = series(idx, "loom", backend, key)
        if loom is not None and loom.median and not loom.error:
            text += f" x{s.median / loom.median:.2f}"
    return text


def render_table(results: list[dict[str, Any]], backends: list[str]) -> str:
    """One block per backend: median [min..max] per system, and each peer's ratio to Loom."""
    idx = index(results)
    columns = [c for c in COLUMNS if any(sys_ == c for sys_, _ in idx)]
    lines: list[str] = []
    label_w = max(len(v) for v in LABELS.values()) + 2
    for backend in backends:
        cells = {
            key: [_cell(idx, c, backend, key) for c in columns]
            for key in ROWS
            if any(series(idx, c, backend, key) is not None for c in columns)
        }
        widths = [
            max([len(HEADERS[c])] + [len(row[i]) for row in cells.values()]) + 2
            for i, c in enumerate(columns)
        ]
        title = f" {BACKEND_TITLES.get(backend, backend)} "
        total = label_w + sum(widths)
        lines.append(f"=={title}{'=' * max(0, total - len(title) - 2)}")
        header = "workload".ljust(label_w) + "".join(
            HEADERS[c].ljust(w) for c, w in zip(columns, widths, strict=True)
        )
        lines.append(header.rstrip())
        if not cells:
            lines.append("  (nothing measured here: see 'not measured' below)")
        for key, row in cells.items():
            line = LABELS[key].ljust(label_w) + "".join(
                text.ljust(w) for text, w in zip(row, widths, strict=True)
            )
            lines.append(line.rstrip())
        lines.append("")
    lines.append(
        "cells: median [min..max] over the repetitions; xr = that system's median ÷ Loom's "
        "(↓ lower is better, ↑ higher is better)"
    )
    notes = [
        f"  {r['system']} on {r['backend']} {r['status']}: {r.get('reason')}"
        for r in results
        if r.get("status") != "ok"
    ]
    for r in results:
        for key, data in r.get("workloads", {}).items():
            if data.get("error"):
                notes.append(f"  {r['system']} on {r['backend']}, {key}: {data['error']}")
    if notes:
        lines.append("not measured:")
        lines.extend(notes)
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    backend: str
    what: str
    value: float | None
    goal: str
    met: bool | None
    by: str

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _check(backend: str, what: str, value: float | None, limit: float, upper: bool) -> Target:
    if value is None:
        return Target(backend, what, None, "", None, "not measured")
    goal = f"{'≤' if upper else '≥'} {num(limit)}"
    met = value <= limit if upper else value >= limit
    if met:
        by = "met"
    elif upper:
        by = f"missed: {value / limit:.2f}x the limit (+{(value / limit - 1) * 100:.0f}%)"
    else:
        by = f"missed: {value / limit:.2f}x the goal (-{(1 - value / limit) * 100:.0f}%)"
    return Target(backend, what, value, goal, met, by)


def evaluate_targets(results: list[dict[str, Any]], backends: list[str]) -> list[Target]:
    idx = index(results)
    out: list[Target] = []

    def med(system: str, backend: str, key: str) -> float | None:
        s = series(idx, system, backend, key)
        return s.median if s is not None and not s.error else None

    for backend in backends:
        if idx.get(("loom", backend), {}).get("status") != "ok":
            continue
        ratio = med("loom", backend, "per_step_floor_ratio")
        what = "per-step overhead ÷ raw floor (alongside)"
        if ratio is None:  # an older result: the separately measured floor
            loom_step, floor = med("loom", backend, "per_step"), med("floor", backend, "per_step")
            ratio = loom_step / floor if loom_step is not None and floor else None
            what = "per-step overhead ÷ raw floor"
        out.append(_check(backend, what, ratio, 1.2, upper=True))
        out.append(
            _check(backend, "3-step workflows/s", med("loom", backend, "throughput"), 2000, False)
        )
        if backend == "sqlite":
            out.append(
                _check(backend, "1-step workflows/s", med("loom", backend, "one_step"), 6000, False)
            )
        out.append(
            _check(backend, "recovery spawn→done ms", med("loom", backend, "recovery"), 400, True)
        )
        reexec = series(idx, "loom", backend, "recovery_reexec")
        worst = max(reexec.samples) if reexec is not None and reexec.samples else None
        out.append(_check(backend, "re-executed completed steps (worst run)", worst, 0, True))
        if backend == "sqlite":
            gate = med("loom", backend, "gate")
            out.append(_check(backend, "gate resume→done ms", gate, 2, True))
    return out


def render_targets(targets: list[Target]) -> str:
    if not targets:
        return "Loom targets: nothing to check (Loom did not run)."
    lines = ["Loom targets (reported, not asserted):"]
    for t in targets:
        lines.append(f"  {t.backend:<9}{t.what:<42}{num(t.value):>10}  {t.goal:<9} {t.by}".rstrip())
    return "\n".join(lines)


def render_settings(results: list[dict[str, Any]]) -> str:
    lines = ["settings in force (as each system reported them):"]
    for r in results:
        if r.get("status") != "ok":
            continue
        d = r.get("describe", {})
        what = ", ".join(f"{k}={v}" for k, v in d.get("durability", {}).items())
        extra = f"; {d['checkpointer']}" if "checkpointer" in d else ""
        lines.append(
            f"  {r['system']}/{r['backend']}: {d.get('version', '?')}{extra}; "
            f"api: {d.get('api', '?')}; {what}"
        )
    return "\n".join(lines)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


CHART_PANELS = (
    "per_step",
    "per_step_floor_ratio",
    "per_step_above_floor",
    "throughput",
    "one_step",
    "recovery",
    "recovery_reexec",
    "gate",
)
LOG_PANELS = frozenset(
    {"per_step", "per_step_above_floor", "throughput", "one_step", "recovery", "gate"}
)
# per_step_floor_ratio and recovery_reexec are drawn on a linear axis from 0
COLORS = {"loom": "#2b6cb0", "dbos": "#dd6b20", "langgraph": "#38a169", "floor": "#718096"}


def chart_targets(idx: Index, key: str, backend: str) -> float | None:
    """Loom's target for one panel and backend, in the panel's unit (None: no target)."""
    if key == "per_step":
        floor = series(idx, "floor", backend, "per_step")
        return 1.2 * floor.median if floor is not None and floor.median else None
    if key == "per_step_above_floor":  # the same target: 1.2x the floor is 0.2x above it
        floor = series(idx, "floor", backend, "per_step")
        return 0.2 * floor.median if floor is not None and floor.median else None
    fixed = {
        ("per_step_floor_ratio", "sqlite"): 1.2,
        ("per_step_floor_ratio", "postgres"): 1.2,
        ("throughput", "sqlite"): 2000.0,
        ("throughput", "postgres"): 2000.0,
        ("one_step", "sqlite"): 6000.0,
        ("recovery", "sqlite"): 400.0,
        ("recovery", "postgres"): 400.0,
        ("recovery_reexec", "sqlite"): 0.0,
        ("recovery_reexec", "postgres"): 0.0,
        ("gate", "sqlite"): 2.0,
    }
    return fixed.get((key, backend))


def write_chart(path: Path, results: list[dict[str, Any]], backends: list[str]) -> bool:
    """Grouped bars (median, min..max whiskers) per workload; returns False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    idx = index(results)
    systems = [c for c in COLUMNS if any(s == c for s, _ in idx)]
    fig, grid = plt.subplots(2, 4, figsize=(20, 9.5))
    for unused in list(grid.flat)[len(CHART_PANELS) :]:
        unused.set_visible(False)
    axes = list(grid.flat)[: len(CHART_PANELS)]
    for ax, key in zip(axes, CHART_PANELS, strict=True):
        width = 0.8 / max(1, len(systems))
        top = 0.0
        lowest = float("inf")
        measured = False
        for j, system in enumerate(systems):
            xs, ys, lo, hi = [], [], [], []
            for i, backend in enumerate(backends):
                s = series(idx, system, backend, key)
                if s is None or s.median is None or s.error:
                    continue
                xs.append(i + (j - (len(systems) - 1) / 2) * width)
                ys.append(s.median)
                lo.append(s.median - (s.low if s.low is not None else s.median))
                hi.append((s.high if s.high is not None else s.median) - s.median)
                top = max(top, s.high or 0.0)
                lowest = min(lowest, s.low or s.median)
                measured = True
            if not xs:
                continue
            bars = ax.bar(
                xs, ys, width, yerr=[lo, hi], capsize=3, label=HEADERS[system],
                color=COLORS[system],
            )  # fmt: skip
            ax.bar_label(bars, labels=[num(y) for y in ys], fontsize=7, padding=2)
        labelled = False
        for i, backend in enumerate(backends):
            goal = chart_targets(idx, key, backend)
            if goal is None or (key in LOG_PANELS and goal <= 0):
                continue
            ax.hlines(
                goal, i - 0.45, i + 0.45, colors="#c53030", linestyles="--", linewidth=1,
                label=None if labelled else "Loom target",
            )  # fmt: skip
            labelled = True
            top = max(top, goal)
            lowest = min(lowest, goal) if goal > 0 else lowest
        if top <= 0:
            ax.text(0.5, 0.5, "all zero" if measured else "not measured", ha="center", va="center",
                    transform=ax.transAxes, fontsize=8)  # fmt: skip
        if key in LOG_PANELS and top > 0:
            ax.set_yscale("log")
            ax.set_ylim(lowest / 3, top * 2)
        elif key not in LOG_PANELS:
            ax.set_ylim(0, max(1.0, top * 1.2))
        ax.set_xticks(range(len(backends)), [BACKEND_TITLES.get(b, b) for b in backends])
        ax.set_xlim(-0.5, len(backends) - 0.5)
        workload = WORKLOADS[key]
        arrow = "higher is better" if workload.higher_is_better else "lower is better"
        ax.set_title(f"{workload.title}\n{workload.unit}, {arrow}", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.suptitle("Loom vs DBOS Transact vs LangGraph: median, whiskers min..max", y=0.99)
    fig.legend(
        handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=len(labels),
        frameon=False,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
