"""The contract between tagma and the harness: one spelling of each name, and a record both sides read."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tagma import contract
from tagma.contract import PlacementRecord, RangesPerRequest

ROOT = Path(__file__).resolve().parents[2]
SPELLED_ONCE = (
    contract.CLI_FLAG,
    contract.ENV_TELEMETRY_FILE,
    contract.ENV_TELEMETRY_INTERVAL_S,
    contract.ENV_PLACEMENT,
    contract.ENV_PREFIX_EVICTION,
    contract.ENV_HOST_TIME_FILE,
    contract.PLACEMENT_TELEMETRY_FILE,
)


def test_no_other_module_spells_a_contract_name() -> None:
    offenders = []
    for path in [*(ROOT / "tagma").rglob("*.py"), *(ROOT / "harness").rglob("*.py")]:
        if path.name == "contract.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in SPELLED_ONCE:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


def test_the_contract_imports_nothing_heavy() -> None:
    tree = ast.parse((ROOT / "tagma" / "contract.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "json", "dataclasses", "typing"}, imported


def test_placement_record_round_trips_and_rejects_a_foreign_line() -> None:
    record = PlacementRecord(
        t=1.5, ranges_per_request=RangesPerRequest(mean=1.5, p99=2.0, max=2), live_requests=2,
        in_place_growths=7, new_ranges=3, merges=0, evictions=0, free_blocks=10, cached_only_blocks=1,
        used_blocks=5, largest_free_range=8, external_fragmentation=0.2, num_blocks=16, policy="headroom",
        peak_ranges_per_request=3, peak_live_requests=4,
    )  # fmt: skip
    assert PlacementRecord.from_json(record.to_json()) == record
    without_peaks = PlacementRecord.from_dict({**record.to_dict(), "peak_ranges_per_request": None})
    assert "peak_ranges_per_request" not in without_peaks.to_dict()
    with pytest.raises(ValueError, match="not a tagma placement telemetry record"):
        PlacementRecord.from_dict({"t": 1.0})


def test_the_telemetry_writer_writes_contract_records(tmp_path: Path) -> None:
    from tagma.engine import EngineNotBuiltError, RangeEngine
    from tagma.probes.telemetry import Telemetry

    path = tmp_path / contract.PLACEMENT_TELEMETRY_FILE
    try:
        engine = RangeEngine(64, policy="headroom")
    except EngineNotBuiltError:
        pytest.skip("the engine library is not built")
    block = lambda i: SimpleNamespace(block_id=i, is_null=False)  # noqa: E731 (vLLM's KVCacheBlock fields read)
    pool = SimpleNamespace(get_num_free_blocks=lambda: 59, num_gpu_blocks=64)
    req_to_blocks = {"a": [block(i) for i in range(1, 6)]}
    manager = SimpleNamespace(block_pool=pool, coordinator=SimpleNamespace(
        single_type_managers=[SimpleNamespace(req_to_blocks=req_to_blocks)]))  # fmt: skip
    with engine:
        req = engine.create_request()
        engine.append(req, 5)
        Telemetry("headroom", manager=manager, engine=engine, path=str(path), interval_s=0.0).on_step()
    Telemetry("paged", manager=manager, path=str(path), interval_s=0.0).on_step()  # paged: no engine
    tagma_line, paged_line = path.read_text().splitlines()
    for line in (tagma_line, paged_line):
        record = PlacementRecord.from_json(line)
        assert record.to_dict() == json.loads(line)  # nothing written that the record does not name
        assert record.live_requests == 1 and record.ranges_per_request.max == 1
        assert record.peak_live_requests == 1 and record.free_blocks == 59
    assert PlacementRecord.from_json(tagma_line).used_blocks == 5
    assert PlacementRecord.from_json(paged_line).used_blocks is None  # the engine's counters are tagma's


def test_every_refusal_is_one_error_type() -> None:
    from tagma.errors import TagmaConfigError, TagmaUnsupported

    err = TagmaUnsupported("context parallelism")
    assert str(err) == "tagma: unsupported: context parallelism" and err.feature == "context parallelism"
    assert isinstance(err, TagmaConfigError) and isinstance(err, ValueError)
    assert isinstance(err, NotImplementedError)
    spelled = []
    for path in (ROOT / "tagma").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and str(node.value).startswith("tagma: unsupported"):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled and all(s.startswith("tagma/errors.py") for s in spelled), spelled
