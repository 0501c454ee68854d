"""The server launcher: failure paths leave no process behind."""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path

import psutil
import pytest

from harness.serve import environment, launcher
from harness.serve.launcher import ENV_ENFORCE_EAGER, Server, ServerError, ServerSpec, server_command


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


@pytest.mark.parametrize(("value", "eager"), [("1", True), ("true", True), ("0", False), (None, False)])
def test_enforce_eager_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str | None, eager: bool
) -> None:
    if value is None:
        monkeypatch.delenv(ENV_ENFORCE_EAGER, raising=False)
    else:
        monkeypatch.setenv(ENV_ENFORCE_EAGER, value)
    spec = ServerSpec(model="m", backend="paged")
    assert spec.enforce_eager is eager
    assert ("--enforce-eager" in server_command(spec, port=8123)) is eager
    assert environment.environment()["enforce_eager"] is eager
    # the mock server takes no vLLM flags
    assert "--enforce-eager" not in server_command(ServerSpec(model="m", dry_run=True), port=8123)


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


SIGTERM_SCRIPT = """
import subprocess, sys, time
from pathlib import Path
from harness.serve import launcher

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
server = launcher.Server(launcher.ServerSpec(model="unused"), Path(sys.argv[1]))
launcher.stop_servers_on_sigterm()  # what Server.start() does first
server.proc = child  # a started server's process group, as start() leaves it
launcher._LIVE.add(server)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_sigterm_to_the_harness_stops_its_servers(tmp_path: Path) -> None:
    """A harness process ended by SIGTERM (a scheduler's cancel, a session's end) still stops its servers:
    without the handler Python dies without running atexit and the server's session outlives it."""
    import signal
    import subprocess
    import sys

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path / "server.log")],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert psutil.pid_exists(child)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        psutil.wait_procs([psutil.Process(child)] if psutil.pid_exists(child) else [], timeout=10)
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        proc.kill()


FAKE_SERVER = """
import http.server, sys

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

if sys.argv[2] == "fail":
    sys.exit("model failed to load")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()  # OSError: [Errno 98] ...
"""


def _fake_servers(monkeypatch: pytest.MonkeyPatch, ports: list[int], mode: str = "serve") -> list[int]:
    """Make Server spawn a tiny HTTP server (a real bind, a real /health) on the drawn ports in turn, and
    report every check as free, so a port that is taken reaches the bind the way the race does."""
    spawned: list[int] = []
    draws = iter(ports)
    monkeypatch.setattr(launcher, "free_port", lambda: next(draws))
    monkeypatch.setattr(launcher, "port_is_free", lambda port: True)

    def command(spec: ServerSpec, port: int) -> list[str]:
        spawned.append(port)
        return [sys.executable, "-c", FAKE_SERVER, str(port), mode]

    monkeypatch.setattr(launcher, "server_command", command)
    return spawned


def _taken_port(stack: contextlib.ExitStack) -> int:
    s = stack.enter_context(socket.socket())
    s.bind(("127.0.0.1", 0))
    s.listen()
    return int(s.getsockname()[1])


def test_a_port_taken_before_the_server_binds_it_is_redrawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with contextlib.ExitStack() as stack:
        taken, fresh = _taken_port(stack), launcher.free_port()
        spawned = _fake_servers(monkeypatch, [taken, fresh])
        with Server(ServerSpec(model="m", startup_timeout_s=30), tmp_path / "server.log") as server:
            assert spawned == [taken, fresh]
            assert server.port == fresh and server.healthy()
        assert not server.alive()


def test_a_fixed_port_taken_at_bind_is_an_error_not_a_redraw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with contextlib.ExitStack() as stack:
        taken = _taken_port(stack)
        spawned = _fake_servers(monkeypatch, [])
        server = Server(ServerSpec(model="m", port=taken, startup_timeout_s=30), tmp_path / "server.log")
        with pytest.raises(ServerError, match="Address already in use") as err:
            server.start()
        assert err.value.port_taken and spawned == [taken]


def test_a_start_up_failure_of_another_kind_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned = _fake_servers(monkeypatch, [launcher.free_port(), launcher.free_port()], mode="fail")
    server = Server(ServerSpec(model="m", startup_timeout_s=30), tmp_path / "server.log")
    with pytest.raises(ServerError, match="model failed to load") as err:
        server.start()
    assert not err.value.port_taken and len(spawned) == 1


def _bare_server(tmp_path: Path, script: str) -> Server:
    """A Server whose process is ``script`` (it binds nothing, so /health never answers)."""
    import subprocess

    server = Server(ServerSpec(model="m"), tmp_path / "server.log")
    server.port = launcher.free_port()
    server.proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    return server


def test_a_server_that_stopped_answering_and_exits_within_the_grace_has_died(tmp_path: Path) -> None:
    server = _bare_server(tmp_path, "import time; time.sleep(1.0)")  # still exiting when first asked
    try:
        assert server.alive()
        assert server.died(grace_s=30.0)
        assert not server.alive()
    finally:
        server.stop()


def test_a_live_process_that_does_not_answer_is_not_called_dead(tmp_path: Path) -> None:
    server = _bare_server(tmp_path, "import time; time.sleep(60)")
    try:
        assert not server.died(grace_s=0.3)
        assert server.alive()
    finally:
        server.stop()
    assert not server.alive()
