"""DryRun: a step interceptor that substitutes the effects of chosen steps in simulations.

In a branch forked for a simulation (``StepInfo.simulation``), a step named in ``steps`` does
not run: the interceptor returns the substitute instead (a value, or a function of the
:class:`StepCall` that computes one) and annotates the record ``loom.simulated``. Outside a
simulation, and for every other step, it passes the call on unchanged. Steps that are safe to
run (reads, a model on a scripted provider) need no entry: they run in the branch as usual.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from loom.runtime._intercept import CallNext, StepCall

__all__ = ["SIMULATED", "DryRun"]

#: The annotation a substituted step's record carries.
SIMULATED = "loom.simulated"


class DryRun:
    """``WorkflowRuntime(interceptors=[DryRun({"charge": {"ok": True}, ...})])``.

    Each value is the substitute result of that step id, or a callable taking the
    :class:`StepCall` (sync or async) that returns one. ``ran`` counts the substitutions.
    """

    def __init__(self, steps: Mapping[str, Any]) -> None:
        self.steps = dict(steps)
        self.ran = 0

    async def invoke(self, call: StepCall, call_next: CallNext) -> Any:
        if not call.info.simulation or call.info.step_id not in self.steps:
            return await call_next(call)
        substitute = self.steps[call.info.step_id]
        if callable(substitute):
            fn: Callable[[StepCall], Any] = substitute
            substitute = fn(call)
            if inspect.isawaitable(substitute):
                substitute = await substitute
        call.annotate(SIMULATED, True)
        self.ran += 1
        return substitute
