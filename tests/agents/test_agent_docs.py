"""The 25-line agent in docs/agents.md and the README runs offline and prints its answer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("doc", "heading"), [("docs/agents.md", "## A 25-line agent"), ("README.md", "## An agent")]
)
def test_the_documented_agent_runs_offline(doc: str, heading: str, tmp_path: Path) -> None:
    text = (ROOT / doc).read_text()
    code = re.search(re.escape(heading) + r".*?```python\n(.*?)```", text, re.S)
    assert code is not None
    body = code.group(1)
    assert len([line for line in body.splitlines() if line.strip()]) <= 25
    script = tmp_path / "agent_example.py"
    script.write_text(body)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Done."
