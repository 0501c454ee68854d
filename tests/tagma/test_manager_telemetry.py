"""The manager's telemetry: one JSON line per step to the telemetry file, its fields, and nothing written
without a file."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tagma.contract import ENV_TELEMETRY_FILE, ENV_TELEMETRY_INTERVAL_S
from tagma.core.registry import build_kv_cache_manager
from tests.tagma.twin import Twin, make_config, manager_kwargs, use_block_object_manager


@pytest.fixture(autouse=True)
def _block_object_manager_with_caching_on(monkeypatch: pytest.MonkeyPatch) -> None:
    use_block_object_manager(monkeypatch)


def test_telemetry_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    path = tmp_path / "telemetry.jsonl"
    monkeypatch.setenv(ENV_TELEMETRY_FILE, str(path))
    monkeypatch.setenv(ENV_TELEMETRY_INTERVAL_S, "0")
    twin = Twin(num_blocks=32)
    twin.add("a", list(range(30)))
    assert twin.admit("a")
    twin.new_step()
    twin.new_step()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    expected = {
        "t", "ranges_per_request", "live_requests", "in_place_growths", "new_ranges", "merges", "evictions",
        "free_blocks", "cached_only_blocks", "used_blocks", "largest_free_range", "external_fragmentation",
        "num_blocks", "policy", "peak_ranges_per_request", "peak_live_requests",
    }
    assert set(lines[-1]) == expected
    assert lines[-1]["live_requests"] == 1 and lines[-1]["used_blocks"] == 8
    assert lines[-1]["ranges_per_request"] == {"mean": 1.0, "p99": 1.0, "max": 1}
    assert lines[-1]["peak_ranges_per_request"] == 1 and lines[-1]["peak_live_requests"] == 1
    assert lines[-1]["policy"] == "headroom" and lines[-1]["num_blocks"] == 32
    assert set(twin.tagma.telemetry_snapshot()) == expected


def test_telemetry_off_without_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv(ENV_TELEMETRY_FILE, raising=False)
    monkeypatch.chdir(tmp_path)
    manager = build_kv_cache_manager(make_config(16), **manager_kwargs())
    manager.new_step_starts()
    assert manager.telemetry.path is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("caching", [True, False], ids=["block_objects", "ranges"])
def test_peak_counts_requests_that_live_between_two_lines(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caching: bool
) -> None:
    """Requests admitted and freed between two due telemetry lines still reach ``peak_live_requests`` on both
    arms, and on disk: the peak is taken at every step start and a rise writes a line at once (a real
    server's short requests on the tiny model can start and end within one interval, and no step follows
    them to write the next due line)."""
    from tagma.probes.telemetry import Telemetry

    path = tmp_path / "telemetry.jsonl"
    monkeypatch.setenv(ENV_TELEMETRY_FILE, str(path))
    monkeypatch.setenv(ENV_TELEMETRY_INTERVAL_S, "3600")
    twin = Twin(num_blocks=64, enable_caching=caching)
    twin.paged.telemetry = Telemetry("paged", manager=twin.paged)
    telemetries = (twin.paged.telemetry, twin.tagma.telemetry)
    for telemetry in telemetries:
        telemetry.on_step()  # the first line is due at once: nothing is live yet
    for i in range(3):
        twin.add(f"r{i}", list(range(10 * i, 10 * i + 9)))
        assert twin.admit(f"r{i}")
    for telemetry in telemetries:
        telemetry.on_step()  # not due, but three requests hold blocks: the peak rose, a line is written
        telemetry.on_step()  # the same peak: no line
    for i in range(3):
        twin.free(f"r{i}")
    for telemetry in telemetries:
        telemetry.on_step()  # not due, no rise: no line
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["policy"], line["live_requests"], line["peak_live_requests"]) for line in lines] == [
        ("paged", 0, 0), ("headroom", 0, 0), ("paged", 3, 3), ("headroom", 3, 3),
    ]  # fmt: skip
