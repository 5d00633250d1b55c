"""loom.placement.http resolves its public names lazily."""

from __future__ import annotations

import pytest


def test_public_names_resolve_lazily() -> None:
    import loom.placement.http as http

    for name in http.__all__:
        assert getattr(http, name) is not None
    with pytest.raises(AttributeError):
        http.NoSuchThing  # noqa: B018
