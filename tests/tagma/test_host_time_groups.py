"""The KV manager's host time per KV cache group (``TAGMA_HOST_TIME_GROUPS=1``): vLLM's manager (its
single-type managers wrapped) and tagma's group managers (their per-group loops) timed on the same terms,
the per-step rows, the reader's columns and the comparison's group rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.request import RequestStatus

from harness.analysis import host_time as reader
from harness.analysis.compare import group_components
from tagma.contract import ENV_HOST_TIME_FILE, ENV_HOST_TIME_GROUPS
from tagma.core.group_prefix_manager import GroupPrefixKVCacheManager
from tagma.core.group_range_manager import GroupRangeKVCacheManager
from tagma.core.registry import build_kv_cache_manager
from tagma.probes import host_time_groups
from tagma.probes import host_time_hooks as hooks
from tagma.probes.host_time import COLUMNS, GROUP_KINDS, HostTimeChunk, process_file
from tagma.probes.host_time_groups import GroupClock, install_group_timers
from tests.tagma.twin import BLOCK, make_config, make_request, manager_kwargs, tagma_request

WINDOW = 8
SHAPE: dict[str, Any] = {"block_size": BLOCK, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
SPECS = [SlidingWindowSpec(**SHAPE, sliding_window=WINDOW), FullAttentionSpec(**SHAPE)]


class ListWriter:
    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []

    def add(self, row: tuple[int, ...]) -> None:
        self.rows.append(row)


def _managers(caching: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
              groups_on: bool = True) -> dict[str, tuple[Any, hooks.SchedulerClock]]:  # fmt: skip
    monkeypatch.setenv(ENV_HOST_TIME_FILE, str(tmp_path / "host_time.jsonl"))
    if groups_on:
        monkeypatch.setenv(ENV_HOST_TIME_GROUPS, "1")
    else:
        monkeypatch.delenv(ENV_HOST_TIME_GROUPS, raising=False)
    monkeypatch.setattr(hooks, "KV_MANAGER_METHODS", hooks.kv_manager_methods(KVCacheManager))
    out = {}
    for name, build in (("paged", KVCacheManager), ("tagma", build_kv_cache_manager)):
        config = make_config(64, specs=SPECS)
        manager = build(config, **manager_kwargs(enable_caching=caching))
        clock = hooks.SchedulerClock()
        clock.writer_factory = lambda role, backend: ListWriter()  # type: ignore[assignment,return-value]
        hooks.after_kv_manager_init(manager, clock)
        out[name] = (manager, clock)
    expected = GroupPrefixKVCacheManager if caching else GroupRangeKVCacheManager
    assert type(out["tagma"][0]) is expected
    return out


def _drive(manager: Any) -> None:
    """A request's prefill and decode past the window (blocks dropped), then its free: every group's work."""
    build = tagma_request if isinstance(manager, GroupPrefixKVCacheManager) else make_request
    req = build("r", list(range(20)))
    computed, hit, _ = manager.get_computed_blocks(req)
    manager.allocate_slots(req, 20 - hit, hit, computed)
    req.status = RequestStatus.RUNNING
    req.num_computed_tokens = 20
    for i in range(12):
        req.append_output_token_ids(1000 + i)
        manager.new_step_starts()
        manager.allocate_slots(req, 1)
        req.num_computed_tokens += 1
    manager.free(req)


@pytest.mark.parametrize("caching", [False, True], ids=["caching-off", "caching-on"])
def test_both_arms_time_every_group_inside_the_manager(
    caching: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    arms = _managers(caching, monkeypatch, tmp_path)
    for name, (manager, clock) in arms.items():
        groups = clock.groups
        assert groups is not None, name
        assert groups.kinds == (GROUP_KINDS.index("window"), GROUP_KINDS.index("full"))
        assert groups.windows == (WINDOW, 0)
        _drive(manager)
        assert all(c > 0 for c in groups.calls), (name, groups.calls)
        assert all(ns > 0 for ns in groups.ns), (name, groups.ns)
        # the groups' time is a part of the manager's (all of it was spent outside a step: OUTSIDE)
        assert sum(groups.ns) < clock.kv_ns[hooks.OUTSIDE]
    paged, tagma = arms["paged"][0], arms["tagma"][0]
    # vLLM's single-type managers carry timed instance attributes; tagma's are vLLM's objects it only reads
    # arithmetic from, left alone: its loops time themselves
    assert all("allocate_new_blocks" in s.__dict__ for s in paged.coordinator.single_type_managers)
    assert not any("allocate_new_blocks" in s.__dict__ for s in tagma.coordinator.single_type_managers)
    assert tagma.group_time is arms["tagma"][1].groups


def test_group_work_outside_a_manager_call_is_not_counted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    arms = _managers(False, monkeypatch, tmp_path)
    manager, clock = arms["tagma"]
    manager._to_allocate(None, 40, 0, False)  # a private call: no timed manager call around it
    single = arms["paged"][0].coordinator.single_type_managers[0]
    assert single.get_num_skipped_tokens(40) == 40 - WINDOW + 1  # timed wrapper, but no manager call
    for _, c in arms.values():
        assert c.groups is not None and c.groups.calls == [0, 0]


def test_off_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    arms = _managers(False, monkeypatch, tmp_path, groups_on=False)
    for manager, clock in arms.values():
        assert clock.groups is None
        assert not any("allocate_new_blocks" in s.__dict__ for s in manager.coordinator.single_type_managers)
    assert arms["tagma"][0].group_time is None
    _drive(arms["tagma"][0])


def test_one_group_gets_no_group_timers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_HOST_TIME_FILE, str(tmp_path / "host_time.jsonl"))
    monkeypatch.setenv(ENV_HOST_TIME_GROUPS, "1")
    manager = KVCacheManager(make_config(64, specs=SPECS[1:]), **manager_kwargs())
    clock = hooks.SchedulerClock()
    assert install_group_timers(manager, clock, ListWriter()) is None and clock.groups is None


# ------------------------------------------------------------------------------- per-step rows


class Out:
    def __init__(self) -> None:
        self.num_scheduled_tokens = {"a": 1}
        self.total_num_scheduled_tokens = 1
        self.scheduled_new_reqs: list[Any] = []
        self.scheduled_cached_reqs = type("C", (), {"new_block_ids": []})()


def test_rows_split_by_step_as_the_scheduler_row(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(0, 10**6, 10))
    monkeypatch.setattr(host_time_groups, "_clock", lambda: next(ticks))
    clock = hooks.SchedulerClock()
    sched, group_rows = ListWriter(), ListWriter()
    clock.restart(sched)
    groups = GroupClock(clock, (1, 0), (128, 0))
    clock.attach_groups(groups, group_rows)
    clock.in_kv = True  # as inside a timed manager call
    groups.stop(0, groups.start())  # schedule side of step 0: 10 ns in group 0
    clock.end_schedule(None, Out(), 100)
    groups.stop(1, groups.start())  # update side of step 0: 10 ns in group 1
    groups.stop(1, groups.start())
    clock.end_update(50)
    clock.end_schedule(None, Out(), 100)
    clock.end_update(50)
    rows = [dict(zip(COLUMNS["kv_groups"], r, strict=True)) for r in group_rows.rows]
    assert [(r["step"], r["group"], r["group_ns"], r["group_calls"]) for r in rows] == [
        (0, 0, 10, 1), (0, 1, 20, 2), (1, 0, 0, 0), (1, 1, 0, 0),
    ]  # fmt: skip
    assert [(r["kind"], r["window"]) for r in rows[:2]] == [(1, 128), (0, 0)]
    assert rows[0]["end_ns"] == sched.rows[0][-1]  # the scheduler row of the same step


def test_a_missing_group_file_is_asked_for_once() -> None:
    """Without a host-time file the factory gives no writer: asked once, not on every step."""
    asked: list[str] = []

    def factory(role: str, backend: str) -> None:
        asked.append(role)

    clock = hooks.SchedulerClock()
    clock.writer_factory = factory  # type: ignore[assignment]
    clock.attach_groups(GroupClock(clock, (1, 0), (128, 0)))
    for _ in range(3):
        clock.end_schedule(None, Out(), 100)
        clock.end_update(50)
    assert asked == ["scheduler", "kv_groups"]


# ------------------------------------------------------------------------------------- the reader


def _write(tmp_path: Path, group_rows: list[tuple[int, ...]]) -> Path:
    base = tmp_path / "host_time.jsonl"
    # step kv upd_kv out_kv sched_other upd_other kv_calls upd_calls out_calls reqs tokens new_ids end_ns
    sched = [(s, 5000, 1000, 0, 4000, 3000, 2, 1, 0, 1, 1, 1, 1000 + s) for s in range(3)]
    for role, rows in (("scheduler", sched), ("kv_groups", group_rows)):
        chunk = HostTimeChunk(role=role, pid=10, backend="paged", t=0.0, timer_overhead_ns=100,
                              columns=COLUMNS[role], rows=rows)  # fmt: skip
        process_file(base, role, 10).write_text(chunk.to_json() + "\n")
    return tmp_path


def test_reader_adds_group_columns_and_takes_their_clock_reads_out(tmp_path: Path) -> None:
    rows = []
    for step in range(3):
        rows += [(step, 0, 1, 128, 2000, 3, 1000 + step), (step, 1, 0, 0, 1500, 2, 1000 + step)]
    run = reader.load_run(_write(tmp_path, rows))
    assert run.groups == ["kv_group0_window128", "kv_group1_full"]
    assert run.steps["kv_group0_window128_ns_net"].tolist() == [2000 - 300] * 3
    assert run.steps["kv_group1_full_ns_net"].tolist() == [1500 - 200] * 3
    # 6000 total - 3 manager calls' clock reads - both reads of each of the 5 nested group calls
    assert run.steps["kv_manager_total_ns_net"].tolist() == [6000 - 300 - 1000] * 3
    summary = reader.summarize(run)
    assert summary["components"]["kv_group1_full_ns_net"]["mean_ns"] == 1300


def test_reader_refuses_a_repeated_group_step(tmp_path: Path) -> None:
    rows = [(0, 0, 1, 128, 10, 1, 1000), (0, 0, 1, 128, 10, 1, 1000)]
    with pytest.raises(ValueError, match="twice"):
        reader.load_run(_write(tmp_path, rows))


def test_group_components_are_those_every_run_has() -> None:
    steps = {
        "A": [(None, {"kv_manager": 1, "kv_group0_window128": 1, "kv_group10_full": 1, "kv_group2_full": 1})],
        "B": [(None, {"kv_manager": 1, "kv_group0_window128": 1, "kv_group10_full": 1}),
              (None, {"kv_group0_window128": 1, "kv_group10_full": 1, "kv_group2_full": 1})],
    }  # fmt: skip
    assert group_components(steps) == ["kv_group0_window128", "kv_group10_full"]
    assert group_components({"A": [], "B": []}) == []
