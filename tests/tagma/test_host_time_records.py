"""Host time per step inside the server, its records: the chunk format, file names, the flush interval,
the writer, and the harness reader that turns a run's files into per-step arrays."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from harness.analysis import host_time as reader
from tagma.contract import ENV_HOST_TIME_FLUSH_S
from tagma.probes.host_time import (
    COLUMNS,
    ChunkWriter,
    HostTimeChunk,
    HostTimeFormatError,
    host_time_files,
    interval_from_env,
    process_file,
    read_chunks,
)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------- records


def _chunk(role: str = "scheduler", rows: int = 3, start: int = 0) -> HostTimeChunk:
    width = len(COLUMNS[role])
    return HostTimeChunk(
        role=role, pid=123, backend="paged", t=1.5, timer_overhead_ns=700, columns=COLUMNS[role],
        rows=[(start + i, *range(10 * i, 10 * i + width - 1)) for i in range(rows)],
    )  # fmt: skip


@pytest.mark.parametrize("role", ["scheduler", "worker", "worker_parts", "kv_groups"])
def test_chunk_round_trip(role: str) -> None:
    chunk = _chunk(role)
    back = HostTimeChunk.from_json(chunk.to_json())
    assert back == chunk
    assert "\n" not in chunk.to_json()


def test_chunk_rejects_bad_lines() -> None:
    good = json.loads(_chunk().to_json())
    with pytest.raises(HostTimeFormatError, match="unknown role"):
        HostTimeChunk.from_json(json.dumps(good | {"role": "api"}))
    with pytest.raises(HostTimeFormatError, match="columns of role 'scheduler'"):
        HostTimeChunk.from_json(json.dumps(good | {"columns": good["columns"][::-1]}))
    with pytest.raises(HostTimeFormatError, match="a row has 2 values"):
        HostTimeChunk.from_json(json.dumps(good | {"rows": [[1, 2]]}))
    with pytest.raises(HostTimeFormatError, match="format version 7"):
        HostTimeChunk.from_json(json.dumps(good | {"version": 7}))
    with pytest.raises(HostTimeFormatError, match="lacks the field 'pid'"):
        HostTimeChunk.from_json(json.dumps({k: v for k, v in good.items() if k != "pid"}))
    with pytest.raises(HostTimeFormatError, match="bad value"):
        HostTimeChunk.from_json(json.dumps(good | {"rows": [["x"] * len(good["columns"])]}))
    with pytest.raises(HostTimeFormatError, match="not a JSON line"):
        HostTimeChunk.from_json("{cut")


def test_file_names_and_reading(tmp_path: Path) -> None:
    base = tmp_path / "host_time.jsonl"
    sched = process_file(base, "scheduler", 11)
    worker = process_file(base, "worker", 12)
    assert (sched.name, worker.name) == ("host_time.scheduler.11.jsonl", "host_time.worker.12.jsonl")
    with pytest.raises(ValueError, match="unknown role"):
        process_file(base, "api", 1)
    sched.write_text(_chunk().to_json() + "\n" + _chunk(start=3).to_json() + "\n" + '{"version": 1, "ro')
    worker.write_text(_chunk("worker").to_json() + "\n")
    assert host_time_files(base) == sorted([sched, worker])
    assert host_time_files(base, "worker") == [worker]
    chunks = read_chunks(sched)  # the cut last line (a killed writer) is skipped
    assert [r[0] for c in chunks for r in c.rows] == [0, 1, 2, 3, 4, 5]
    sched.write_text("garbage\n" + _chunk().to_json() + "\n")
    with pytest.raises(HostTimeFormatError, match=r"scheduler\.11\.jsonl:1"):
        read_chunks(sched)


def test_interval_from_env() -> None:
    assert interval_from_env({}) == 0.5
    assert interval_from_env({ENV_HOST_TIME_FLUSH_S: "2"}) == 2.0
    assert interval_from_env({ENV_HOST_TIME_FLUSH_S: "0"}) == 0.5
    with pytest.raises(ValueError, match="not a number"):
        interval_from_env({ENV_HOST_TIME_FLUSH_S: "soon"})


def test_writer_flushes_on_interval_and_on_close(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with pytest.raises(ValueError, match="interval"):
        ChunkWriter(path, "scheduler", "paged", 0.0)
    writer = ChunkWriter(path, "scheduler", "paged", 0.05)
    assert writer.timer_overhead_ns > 0
    width = len(COLUMNS["scheduler"])
    writer.add((0,) * width)
    writer.add((1,) * width)
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the flusher thread writes without any further call
    assert [r[0] for c in read_chunks(path) for r in c.rows] == [0, 1]
    writer.add((2,) * width)
    writer.close()
    writer.close()  # idempotent
    chunks = read_chunks(path)
    assert [r[0] for c in chunks for r in c.rows] == [0, 1, 2]
    assert all(c.pid == os.getpid() and c.backend == "paged" for c in chunks)
    assert writer.flush() == 0  # nothing left: no empty line


# ------------------------------------------------------------------------------------- the reader


def _write_run(tmp_path: Path, sched_rows: list[tuple[int, ...]], worker_rows: list[tuple[int, ...]]) -> Path:
    base = tmp_path / "host_time.jsonl"
    for role, rows, pid in (("scheduler", sched_rows, 10), ("worker", worker_rows, 11)):
        chunk = HostTimeChunk(role=role, pid=pid, backend="tagma", t=0.0, timer_overhead_ns=100,
                              columns=COLUMNS[role], rows=rows)  # fmt: skip
        process_file(base, role, pid).write_text(chunk.to_json() + "\n")
    return tmp_path


def _sched_row(step: int, kv: int, reqs: int, tokens: int) -> tuple[int, ...]:
    # step kv upd_kv out_kv sched_other upd_other kv_calls upd_calls out_calls reqs tokens new_ids end_ns
    return (step, kv, 500, 0, 4000, 3000, 2, 1, 0, reqs, tokens, 1, 1000 + step)


def _worker_row(step: int, reqs: int, tokens: int) -> tuple[int, ...]:
    # step upd_states prep_inputs worker_prep block_table bt_calls reqs tokens exec_wall end_ns
    return (step, 2000, 3000, 5000, 800, 2, reqs, tokens, 10**6, 1000 + step)


def test_reader_per_step_arrays_and_summary(tmp_path: Path) -> None:
    steps = [(0, 1000, 1, 40), (1, 2000, 2, 2), (2, 0, 0, 0), (3, 3000, 2, 2)]
    sched = [_sched_row(s, kv, r, t) for s, kv, r, t in steps]
    run_dir = _write_run(tmp_path, sched, [_worker_row(s, r, t) for s, _, r, t in steps])
    run = reader.load_run(run_dir)
    assert run.backend == "tagma" and run.aligned and run.num_steps == 4
    assert run.steps["kv_manager_ns"].tolist() == [1000, 2000, 0, 3000]
    assert run.steps["kv_manager_ns_net"].tolist() == [800, 1800, -200, 2800]  # 2 calls x 100 ns clock
    assert run.steps["kv_manager_total_ns"].tolist() == [1500, 2500, 500, 3500]
    assert run.steps["schedule_other_ns_net"].tolist() == [3700] * 4  # (2 calls + itself) x 100
    assert run.steps["update_other_ns_net"].tolist() == [2800] * 4
    assert run.steps["worker_prepare_ns_net"].tolist() == [5000 - 100 * 6] * 4
    assert run.steps["block_table_ns_net"].tolist() == [600] * 4
    summary = reader.summarize(run)
    assert summary["steps"] == 3 and summary["steps_total"] == 4  # the idle step left out
    kv = summary["components"]["kv_manager_ns_net"]
    assert kv["mean_ns"] == pytest.approx((800 + 1800 + 2800) / 3)
    assert kv["p50_ns"] == 1800
    assert kv["per_request_ns"] == pytest.approx((800 + 1800 + 2800) / 5)
    assert summary["components"]["worker_prepare_ns_net"]["mean_ns"] == 4400
    assert reader.summarize(run, since_ns=1002)["steps"] == 1
    assert json.dumps(summary)  # plain JSON for the report


def test_reader_joins_the_workers_parts_by_process_and_step(tmp_path: Path) -> None:
    steps = [(0, 1000, 1, 40), (1, 2000, 2, 2), (2, 3000, 2, 2)]
    workers = [_worker_row(s, r, t) for s, _, r, t in steps]
    run_dir = _write_run(tmp_path, [_sched_row(*x) for x in steps], workers)
    # step slot_mappings attn_metadata preprocess forward_cpu forward_wall end_ns; a step short (not flushed)
    parts = [(s, 300, 400 + s, 500, 9000, 9500 + s, 1000 + s) for s in range(2)]
    chunk = HostTimeChunk(role="worker_parts", pid=11, backend="tagma", t=0.0, timer_overhead_ns=100,
                          columns=COLUMNS["worker_parts"], rows=parts)  # fmt: skip
    process_file(tmp_path / "host_time.jsonl", "worker_parts", 11).write_text(chunk.to_json() + "\n")
    run = reader.load_run(run_dir)
    assert run.aligned and run.num_steps == 2  # cut to the steps the parts have
    assert run.steps["attn_metadata_ns"].tolist() == [400, 401]
    assert run.steps["attn_metadata_ns_net"].tolist() == [300, 301]  # one clock read
    assert run.steps["forward_wall_ns"].tolist() == [9500, 9501]  # wall time: no clock correction
    assert "forward_wall_ns_net" not in run.steps
    assert any("worker_parts" in f for f in run.files)
    # another process's parts are not this worker's
    other = tmp_path / "other"
    other.mkdir()
    _write_run(other, [_sched_row(*x) for x in steps], workers)
    process_file(other / "host_time.jsonl", "worker_parts", 99).write_text(chunk.to_json() + "\n")
    assert "attn_metadata_ns" not in reader.load_run(other).steps
    # parts that start at another step than their worker are refused
    late = [(s + 1, *row[1:]) for s, row in enumerate(parts)]
    chunk.rows = late
    process_file(tmp_path / "host_time.jsonl", "worker_parts", 11).write_text(chunk.to_json() + "\n")
    with pytest.raises(ValueError, match="starts at step 1"):
        reader.load_run(run_dir)


def test_reader_refuses_misaligned_workers_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="host_time.scheduler"):
        reader.load_run(tmp_path)
    run_dir = _write_run(tmp_path, [_sched_row(0, 1000, 1, 40)], [_worker_row(0, 1, 41)])
    run = reader.load_run(run_dir)
    assert not run.aligned and len(run.worker) == 1
    assert "worker_prepare_ns_net" not in run.steps
    assert "worker_prepare_ns_net" not in reader.summarize(run)["components"]
    gap = [_sched_row(0, 1, 1, 1), _sched_row(2, 1, 1, 1)]
    _write_run(tmp_path, gap, [])
    with pytest.raises(ValueError, match="not consecutive"):
        reader.load_run(tmp_path)


def test_reader_imports_no_vllm() -> None:
    import subprocess
    import sys

    code = (
        "import sys, harness.analysis.host_time; "
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr
