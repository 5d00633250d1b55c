"""The timeline table shows what was recorded, verbatim: recorded text is never rich markup."""

from __future__ import annotations

from rich.console import Console

from loom.cli._render import render_timeline
from loom.model import Envelope, EventType


def test_recorded_text_in_square_brackets_is_shown_not_taken_for_markup() -> None:
    failed = Envelope.create(
        "x",
        1,
        EventType.STEP_FAILED,
        {
            "position": 0,
            "step_id": "charge",
            "attempt": 3,
            "error": {"type": "ValueError", "message": "card [bold]declined[/bold]"},
            "final": True,
        },
        fence=1,
        recorded_at=0.0,
    )
    console = Console(record=True, width=200)
    render_timeline(console, [failed], "x")
    text = console.export_text()
    assert "ValueError: card [bold]declined[/bold] [final]" in text, text
