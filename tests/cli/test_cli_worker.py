"""`loom worker serve` (loom.cli._worker): refuses to serve without authentication, builds
authenticators, loads runtimes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import loom
from loom.placement.http import AnyOfAuth
from tests.support.http_keys import AUDIENCE, DISPATCHER_EMAIL, kit
from tests.support.http_rig import SECRET

# ------------------------------------------------------------------------------ worker CLI


def test_cli_refuses_to_serve_without_authentication(monkeypatch: pytest.MonkeyPatch) -> None:
    from loom.cli._worker import worker_app

    runner = CliRunner()
    monkeypatch.delenv("LOOM_WORKER_TOKEN_ENV", raising=False)
    monkeypatch.delenv("LOOM_WORKER_GOOGLE_AUDIENCE", raising=False)
    monkeypatch.delenv("LOOM_WORKER_NO_AUTH", raising=False)
    result = runner.invoke(worker_app, ["serve", "--app", "tests.support.http_flows:make_runtime"])
    assert result.exit_code == 1 and "needs authentication" in result.output
    monkeypatch.delenv("LOOM_TEST_UNSET_TOKEN", raising=False)
    result = runner.invoke(
        worker_app,
        [
            "serve",
            "--app",
            "tests.support.http_flows:make_runtime",
            "--token-env",
            "LOOM_TEST_UNSET_TOKEN",
        ],
    )
    assert result.exit_code == 1 and "LOOM_TEST_UNSET_TOKEN is not set" in result.output


async def test_cli_builds_authenticators_and_loads_runtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loom.cli._worker import build_authenticator, load_runtime

    monkeypatch.setenv("LOOM_TEST_TOKEN", SECRET)
    certs = tmp_path / "certs.json"
    certs.write_text(json.dumps(kit().certs()))
    both = build_authenticator(
        token_env="LOOM_TEST_TOKEN",
        google_audience=AUDIENCE,
        google_emails=[DISPATCHER_EMAIL],
        google_certs_file=certs,
        no_auth=False,
    )
    assert isinstance(both, AnyOfAuth)
    assert (await both.authenticate(f"Bearer {kit().mint()}")).subject == DISPATCHER_EMAIL
    with pytest.raises(loom.errors.ConfigurationError):
        build_authenticator(
            token_env="LOOM_TEST_TOKEN",
            google_audience=None,
            google_emails=None,
            google_certs_file=None,
            no_auth=True,
        )
    monkeypatch.setenv("LOOM_TEST_STORE", f"sqlite:{tmp_path / 'cli.db'}")
    runtime = await load_runtime("tests.support.http_flows:make_runtime")
    assert {f.id for f in runtime.flows} == {"held-three", "gated"}
    await runtime.close()
    for bad in [
        "tests.support.http_flows",
        "tests.support.http_flows:nope",
        "no_such_module:x",
        "tests.support.http_flows:FLOWS",
    ]:
        with pytest.raises(loom.errors.ConfigurationError):
            await load_runtime(bad)
