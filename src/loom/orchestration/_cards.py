"""Agent cards: what a registered agent or flow says about itself (A2A's AgentCard)."""

from __future__ import annotations

from typing import Any

import pydantic

__all__ = ["AgentCard", "AgentSkill"]


class AgentSkill(pydantic.BaseModel):
    """One thing an agent can do (A2A ``AgentSkill``)."""

    model_config = pydantic.ConfigDict(frozen=True)

    id: str
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()
    input_modes: tuple[str, ...] | None = None
    output_modes: tuple[str, ...] | None = None


class AgentCard(pydantic.BaseModel):
    """What an agent (or a flow) registered on a bus offers.

    ``name`` is how callers address it; ``flow_id`` is the flow that runs its tasks (the
    name, unless given). ``input_modes``/``output_modes`` are media types (``text/plain``
    for a string, ``application/json`` for structured data). ``input_schema`` (a JSON
    schema, filled from the flow's input type when registered from a flow object) lets a
    plan's inputs be checked before anything runs.
    """

    model_config = pydantic.ConfigDict(frozen=True)

    name: str
    description: str = ""
    version: str = "1"
    skills: tuple[AgentSkill, ...] = ()
    input_modes: tuple[str, ...] = ("text/plain", "application/json")
    output_modes: tuple[str, ...] = ("application/json",)
    flow_id: str = ""
    input_schema: dict[str, Any] | None = None

    @pydantic.model_validator(mode="after")
    def _default_flow(self) -> AgentCard:
        if not self.flow_id:
            object.__setattr__(self, "flow_id", self.name)
        return self

    def skill(self, skill_id: str) -> AgentSkill | None:
        return next((s for s in self.skills if s.id == skill_id), None)
