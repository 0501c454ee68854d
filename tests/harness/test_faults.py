"""Faults on real servers: a server killed mid-round in the paired design, a client gone mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import pytest

from harness.client import send_one
from harness.designs import paired
from harness.designs.server_run import ServerRun
from harness.workload.spec import RequestSpec, Workload
from tests.harness.test_config import _compose


def _ids_request(index: int, rng: np.random.Generator, n: int, max_tokens: int) -> RequestSpec:
    ids = [int(x) for x in rng.integers(3, 8000, size=n)]
    return RequestSpec(
        index=index, prompt=ids, prompt_tokens=n, max_tokens=max_tokens, source="random ids", target_tokens=n
    )


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.slow
def test_paired_server_killed_mid_round_fails_that_round_and_the_next_runs(
    tmp_path: Path, tok_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _compose(
        "run=ci",
        "run.design=paired",
        "load=serial",
        "run.repeats=2",
        "run.host_time=false",
        f"model.path={tok_dir}",
        "server.max_model_len=2048",
        "workload.input_len.low=200",
        "workload.input_len.high=200",
        "workload.output_len.value=64",
        "server.kv_cache_space_gib=1",
        f"results_dir={tmp_path}",
        "run_id=faults",
    )
    rng = np.random.default_rng(0)
    workload = Workload(
        spec=cfg.workload,
        warmup=[_ids_request(0, rng, 64, 4)],
        requests=[_ids_request(i, rng, 200, 64) for i in range(10)],
        provenance={},
    )
    # The kill lands at a fixed point of the replay (before round 0's candidate gets its last request), not
    # after a timer, which raced the replay's end in CI. Nothing waits for the process to go: the design must
    # see a server that is still exiting, moments before the round ends, as dead.
    victim: dict[str, object] = {}
    killed: list[int] = []
    begin_replay = ServerRun.begin_replay

    def begin_and_mark(self: ServerRun) -> None:
        begin_replay(self)
        if self.index == 1 and not victim:  # round 0's candidate
            assert self.server is not None and self.server.proc is not None
            victim.update(url=self.base_url, pid=self.server.proc.pid, sent=0)

    async def send_or_kill(session: object, url: str, *args: object, **kwargs: object) -> None:
        if victim and not killed and url.startswith(str(victim["url"])):
            victim["sent"] = int(victim["sent"]) + 1  # type: ignore[call-overload]
            if victim["sent"] == len(workload.requests):
                killed.append(int(victim["pid"]))  # type: ignore[call-overload]
                os.killpg(killed[0], signal.SIGKILL)  # the whole server: API process and engine core
        await send_one(session, url, *args, **kwargs)

    monkeypatch.setattr(ServerRun, "begin_replay", begin_and_mark)
    monkeypatch.setattr(paired, "send_one", send_or_kill)
    before = _children()
    statuses = paired.run(cfg, workload)
    assert killed, "the kill never fired"
    assert [(s["index"], s["status"]) for s in statuses] == [
        (0, "failed"),
        (1, "failed"),
        (2, "ok"),
        (3, "ok"),
    ]
    for s in statuses[:2]:
        assert "candidate (tagma) server died mid-run" in s["reason"], s["reason"]
    assert all(s["completed"] == 10 for s in statuses[2:])  # the next round ran in full
    assert _children() <= before  # nothing left behind
    assert not [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == killed[0]]


def _pgid(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        return os.getpgid(pid)
    return None


async def _hold_then_drop(base_url: str, body: dict, chunks: int) -> dict:
    """Stream ``chunks`` token events, read the gauge while the request holds blocks, then go away.

    ``finished_early`` is set when the gauge showed no running request because the stream had already run to
    its end: the client was starved for the whole decode (a loaded CI machine, seen once), so nothing was
    held to drop. That attempt proves nothing either way and the caller tries again."""
    from harness.soak.driver import metrics

    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        seen = 0
        async for data in resp.content.iter_any():
            seen += data.count(b'"choices":[{')
            if seen >= chunks:
                break
        held = dict(await asyncio.to_thread(metrics, base_url))
        if held.get("running") != 1:
            rest = await resp.content.read()
            held["finished_early"] = b"[DONE]" in rest
        resp.close()  # the client goes away mid-stream
    return held


def _hold(base_url: str, body: dict, chunks: int, attempts: int = 3) -> dict:
    for _ in range(attempts):
        held = asyncio.run(_hold_then_drop(base_url, body, chunks))
        if not held.get("finished_early"):
            return held
    raise AssertionError(f"the stream ran to its end before the gauge was read in all {attempts} attempts")


@pytest.mark.slow
def test_client_disconnect_mid_stream_frees_its_blocks_on_both_arms(tmp_path: Path, tok_dir: Path) -> None:
    from harness.soak.config import SoakConfig
    from harness.soak.driver import idle_state, start_arms, wait_drained
    from harness.soak.invariants import drain_violations

    cfg = dataclasses.replace(SoakConfig.load("short"), duration_s=1.0)
    rng = np.random.default_rng(1)
    body = {
        "model": str(tok_dir),
        "prompt": [int(x) for x in rng.integers(3, 8000, size=600)],
        "max_tokens": 1440,  # 2,040 tokens of the 2,048 the soak's servers allow: the longest decode
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    before = _children()
    with contextlib.ExitStack() as stack:
        arms = start_arms(cfg, tok_dir, tmp_path, stack)
        for arm in arms:
            idle = idle_state(arm, str(tok_dir), cfg.telemetry_interval_s)
            held = _hold(arm.server.base_url, body, chunks=3)
            assert held["running"] == 1 and held["kv_cache_usage"] > idle["kv_cache_usage"], (arm.label, held)
            assert wait_drained(arm, 60), f"{arm.label} still runs the dropped request"
            drained = idle_state(arm, str(tok_dir), cfg.telemetry_interval_s)
            assert drain_violations(arm.label, idle, drained) == []
            assert arm.server.alive()
    assert _children() <= before
