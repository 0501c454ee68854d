"""The paired design pauses before a pair's second request, long enough for the other server's readers to stop
spinning; the pair's first request (same server as the last one) goes at once."""

from __future__ import annotations

import asyncio
import inspect
import time

import numpy as np
import pytest
from tqdm import tqdm

from harness.client import RequestResult
from harness.designs import paired
from harness.workload.spec import Workload
from tests.harness.test_config import _compose
from tests.harness.test_faults import _ids_request


def _sent_times(monkeypatch: pytest.MonkeyPatch, gap_s: float, pairs: int, wave: int = 1,
                round_index: int = 0) -> list[tuple[str, float, float]]:  # fmt: skip
    """(url, sent, done) of every request the design sends, the servers faked by a 10 ms answer; the first
    entry is ("start", t, t): when the replay was called."""
    cfg = _compose("run=ci", f"run.pair_gap_s={gap_s}", "load=closed", f"load.max_concurrency={wave}")
    rng = np.random.default_rng(0)
    workload = Workload(spec=cfg.workload, warmup=[], provenance={},
                        requests=[_ids_request(i, rng, 8, 4) for i in range(pairs)])  # fmt: skip
    log: list[tuple[str, float, float]] = [("start", time.perf_counter(), time.perf_counter())]

    async def answer(session: object, url: str, body: bytes, res: RequestResult, *_: object) -> RequestResult:
        sent = time.perf_counter()
        await asyncio.sleep(0.01)
        res.success = True
        log.append((url, sent, time.perf_counter()))
        return res

    monkeypatch.setattr(paired, "send_one", answer)
    with tqdm(disable=True) as bar:
        replay = asyncio.run(paired.replay_pairs(cfg, ("http://a", "http://b"), workload, round_index, bar))
    assert [len(r) for r in replay.results] == [pairs, pairs] and len(replay.waves) == pairs
    assert len(replay.first) == pairs
    return log[1:]


def test_the_first_wave_waits_until_the_warm_ups_stop_spinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both servers were just warmed up: the round's first wave waits the gap too, so the server warmed up
    last is not spinning beside it."""
    gap = 0.2
    start = time.perf_counter()
    log = _sent_times(monkeypatch, gap, pairs=2)
    assert log[0][1] - start >= gap


@pytest.mark.parametrize("waves_per_round", [2, 3])
def test_rounds_take_turns_at_opening(monkeypatch: pytest.MonkeyPatch, waves_per_round: int) -> None:
    """Whatever the number of waves in a round, round 0 opens with the baseline and round 1 with the
    candidate (an even count used to keep every round opening with the baseline)."""
    for round_index, url in ((0, "http://a"), (1, "http://b"), (2, "http://a")):
        log = _sent_times(monkeypatch, 0.0, pairs=2 * waves_per_round, wave=2, round_index=round_index)
        assert log[0][0].startswith(url)


def test_a_pairs_second_request_waits_the_gap_and_its_first_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    gap = 0.2
    log = _sent_times(monkeypatch, gap, pairs=4)
    assert [u.split("/")[2] for u, _, _ in log] == list("abbaabba")  # the order alternates pair by pair
    waits = [log[i][1] - log[i - 1][2] for i in range(1, len(log))]
    switches = [w for i, w in enumerate(waits, 1) if log[i][0] != log[i - 1][0]]
    stays = [w for i, w in enumerate(waits, 1) if log[i][0] == log[i - 1][0]]
    assert len(switches) == 4 and all(w >= gap for w in switches), switches
    assert len(stays) == 3 and all(w < gap / 2 for w in stays), stays


def test_a_wave_goes_to_one_server_at_once_and_then_to_the_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """At concurrency 3 the unit is a wave: its 3 prompts are all sent before any answers, to one server;
    the other gets them only after all 3 answered and the gap; the first server alternates wave by wave."""
    gap = 0.1
    log = _sent_times(monkeypatch, gap, pairs=7, wave=3)  # waves of 3, 3 and 1
    order = "".join(u.split("/")[2] for u, _, _ in log)
    assert order == "aaabbb" + "bbbaaa" + "ab"
    for w0 in (0, 3, 6, 9):  # each wave on one server: every send before the first answer
        wave = log[w0:w0 + 3]
        assert max(t for _, t, _ in wave) < min(d for _, _, d in wave)
    assert log[3][1] - max(d for _, _, d in log[:3]) >= gap


def test_no_gap_sends_back_to_back(monkeypatch: pytest.MonkeyPatch) -> None:
    log = _sent_times(monkeypatch, 0.0, pairs=3)
    assert max(log[i][1] - log[i - 1][2] for i in range(1, len(log))) < 0.1


def test_a_negative_gap_is_refused() -> None:
    with pytest.raises(ValueError, match="pair_gap_s"):
        _compose("run.pair_gap_s=-1")


@pytest.mark.parametrize("run", ["default", "ci"])
def test_the_shipped_gap_outlasts_vllms_reader_busy_wait(run: str) -> None:
    """The gap is there for vLLM's shared-memory reader, which spins for ``busy_loop_s`` after its last read;
    a vLLM that spins longer must fail here rather than bias the paired design in silence."""
    shm_broadcast = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")
    busy_loop_s = inspect.signature(shm_broadcast.SpinCondition).parameters["busy_loop_s"].default
    assert _compose(f"run={run}").run.pair_gap_s > busy_loop_s


def _run(arm: str, ttfts: list[tuple[bool, float]]) -> dict:
    return {"status": "ok", "arm": arm, "backend": "paged",
            "requests": [{"success": True, "first": f, "ttft_ms": t} for f, t in ttfts]}  # fmt: skip


def test_the_report_shows_a_slot_effect_on_one_arm() -> None:
    """One arm slow when it goes second (what the pause removed): its line shows the gap and the count."""
    fine = [(k % 2 == 0, 50.0 + k % 3) for k in range(20)]
    slowed = [(k % 2 == 1, 50.0 + k % 3 if k % 2 else 800.0) for k in range(20)]
    (line,) = paired.slot_lines([_run("baseline", fine), _run("candidate", slowed)], ("paged", "paged"))
    assert "baseline 51.0 / 51.0 ms, slow 0 / 0 of 10 / 10" in line
    assert "candidate 51.0 / 800.0 ms, slow 0 / 10 of 10 / 10" in line
    (only,) = paired.slot_lines([_run("baseline", fine)], ("paged", "paged"))
    assert "baseline" in only and "candidate" not in only
    assert paired.slot_lines([], ("paged", "paged")) == []
