"""``import loom`` loads what running a flow needs, not the agent loop and the model providers'
types (imported on first use of their names), and still folds every log: the agent events'
registrations come with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import loom
import loom.agents

_PROBE = """
import json, sys
import loom
from loom.model._registry import lookup
loaded = sorted(m for m in sys.modules if m.startswith(("loom.agents.", "loom.llm")))
print(json.dumps({"loaded": loaded, "registered": [
    lookup(t) is not None for t in ("agents.model_called", "agents.vote_recorded")
]}))
"""


def test_import_loom_leaves_the_agent_loop_and_the_providers_unloaded() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    seen = json.loads(out)
    assert seen["loaded"] == ["loom.agents._events"]  # the registrations, and nothing else
    assert seen["registered"] == [True, True]


def test_every_agent_name_resolves_on_first_use() -> None:
    exported = loom.agents._EXPORTS
    assert set(exported) == set(loom.agents.__all__)
    for name, module in exported.items():
        value = getattr(loom.agents, name)
        assert value is getattr(sys.modules[module], name), name
    for name in loom._AGENT_NAMES:
        assert getattr(loom, name) is getattr(loom.agents, name), name
    from loom import Agent, tool  # from-imports go through the same hook

    assert Agent is loom.agents.Agent and tool is loom.agents.tool
    assert set(loom._AGENT_NAMES) <= set(dir(loom))
    assert set(loom.agents.__all__) <= set(dir(loom.agents))


@pytest.mark.parametrize("module", [loom, loom.agents])
def test_an_unknown_name_is_still_an_attribute_error(module: object) -> None:
    with pytest.raises(AttributeError, match="no attribute 'Agnet'"):
        _ = module.Agnet  # type: ignore[attr-defined]
