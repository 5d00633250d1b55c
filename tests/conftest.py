from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loom import faults


@pytest.fixture(autouse=True)
def _no_armed_faults() -> Iterator[None]:
    faults.disarm_all()
    yield
    faults.disarm_all()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "loom.db"


PG_DSN = os.environ.get("LOOM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
