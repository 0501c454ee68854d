"""The server launcher: failure paths leave no process behind."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from harness.serve.launcher import Server, ServerError, ServerSpec, server_command


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_spec_rejects_unknown_backend() -> None:
    with pytest.raises(ValueError, match="backend"):
        ServerSpec(model="m", backend="vattention")


def test_command_binds_loopback_and_names_backend() -> None:
    cmd = server_command(ServerSpec(model="m", backend="tagma", max_model_len=4096), port=8123)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--kv-cache-backend") + 1] == "tagma"
    assert cmd[cmd.index("--max-model-len") + 1] == "4096"


def test_port_in_use_is_refused_before_spawning(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        before = _descendants()
        server = Server(ServerSpec(model="m", port=port), tmp_path / "server.log")
        with pytest.raises(ServerError, match="already in use"):
            server.start()
        assert _descendants() == before
        assert not server.alive()


def test_stop_is_idempotent_without_start(tmp_path: Path) -> None:
    server = Server(ServerSpec(model="m"), tmp_path / "server.log")
    server.stop()
    server.stop()


@pytest.mark.slow
def test_bad_model_path_fails_fast_with_the_log_and_no_orphans(tmp_path: Path) -> None:
    before = _descendants()
    server = Server(
        ServerSpec(model=str(tmp_path / "no-such-model"), startup_timeout_s=300), tmp_path / "server.log"
    )
    with pytest.raises(ServerError, match="exited with code") as err:
        server.start()
    assert "no-such-model" in str(err.value)
    assert _descendants() == before
