"""The notebooks run headless against small results made here; `harness.analysis.plots_cli` (serve runs,
sweeps) and `benchmarks.host.report` (host-bench runs) redraw every figure of a results directory without
Jupyter, and `harness.analysis.sweep_report` puts a sweep's cells in one table and figure.

Serve runs are fabricated from files (no servers, as in test_report_and_resume); the host-bench result is a
real smoke run of benchmarks.host (native part off: no C++ build needed).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from hydra import compose, initialize_config_dir
from nbclient import NotebookClient
from omegaconf import OmegaConf

from benchmarks.host.report import __main__ as host_report_cli
from harness import report
from harness.analysis import plots_cli, sweep_report
from harness.files import read_json, write_json
from tagma.contract import ENV_N_BOOT, ENV_RUN_DIR, ENV_SWEEP_DIR
from tests.harness.test_report_and_resume import ABBA6, _fake_run, _meta

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
SERVE_FIGURES = {"latency_cdfs", "ab_ratios", "per_run", "kv_usage", "prompt_lengths", "ranges_per_request"}


def _serve_run(root: Path, rate: float, slowdown: float) -> Path:
    _meta(root)
    cfg = read_json(root / "config.json")
    cfg["workload"] = {"name": "w"}
    cfg["load"] = {"mode": "open", "request_rate": rate, "max_concurrency": None}
    write_json(root / "config.json", cfg)
    for index, backend in enumerate(ABBA6):
        _fake_run(root, index, backend, scale=slowdown if backend == "tagma" else 1.0)
    report.write_report(root, n_boot=100)
    return root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hydra-multirun-like sweep: <sweep>/<job num>/run, tagma slower as the rate grows."""
    root = tmp_path_factory.mktemp("sweep")
    for job, (rate, slowdown) in enumerate([(0.05, 1.0), (0.1, 1.1), (0.2, 1.25)]):
        _serve_run(root / str(job) / "run", rate, slowdown)
    return root


@pytest.fixture(scope="module")
def serve_run(sweep: Path) -> Path:
    return sweep / "2" / "run"


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from benchmarks.host.main import run

    results = tmp_path_factory.mktemp("host")
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(
            config_name="host_bench",
            overrides=[
                "size=smoke", f"repo_dir={REPO}", f"results_dir={results}", "run_id=nb", "point_latest=false",
                "native.enabled=false",
                "sections=[engine_ops,manager,write_path,block_table_traffic,fragmentation]",
            ],
        )  # fmt: skip
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    run(resolved)
    return results / "nb"


def _execute(name: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> nbformat.NotebookNode:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # raises CellExecutionError on the first failing cell
    resources = {"metadata": {"path": str(NOTEBOOKS)}}
    NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources).execute()
    return nb


def _images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.parametrize("name", ["serve_run.ipynb", "host_bench.ipynb"])
def test_notebooks_are_committed_without_outputs(name: str) -> None:
    nb = json.loads((NOTEBOOKS / name).read_text())
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None, name
    params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and ENV_RUN_DIR in "".join(params[0]["source"])


def test_serve_notebook_runs(serve_run: Path, sweep: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {ENV_RUN_DIR: str(serve_run), ENV_SWEEP_DIR: str(sweep), ENV_N_BOOT: "100"}
    nb = _execute("serve_run.ipynb", monkeypatch, **env)
    assert _images(nb) == len(SERVE_FIGURES) + 1  # the run's figures and the sweep's
    text = json.dumps(nb)
    assert "mean_ttft_ms" in text and "0.2 req/s" in text


def test_host_notebook_runs(host_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _execute("host_bench.ipynb", monkeypatch, **{ENV_RUN_DIR: str(host_run)})
    assert _images(nb) == len(read_json(host_run / "host_bench.json")["plots"]) >= 4


def test_plots_cli_redraws_a_serve_run(serve_run: Path) -> None:
    shutil.rmtree(serve_run / "plots")
    assert plots_cli.main([str(serve_run), "--n-boot", "50"]) == 0
    assert {p.stem for p in (serve_run / "plots").glob("*.png")} == SERVE_FIGURES


def test_host_report_redraws_a_host_run(host_run: Path) -> None:
    names = read_json(host_run / "host_bench.json")["plots"]
    for name in names:
        (host_run / name).unlink()
    assert host_report_cli.main([str(host_run)]) == 0
    assert all((host_run / name).stat().st_size > 0 for name in names)


def test_plots_cli_redraws_a_sweep(sweep: Path) -> None:
    assert plots_cli.main([str(sweep), "--n-boot", "50"]) == 0
    assert (sweep / "plots" / "sweep_ratios.png").exists()
    assert all((sweep / j / "run" / "plots" / "ranges_per_request.png").exists() for j in "012")


def test_sweep_report_one_table_and_one_figure(sweep: Path, tmp_path: Path) -> None:
    extra = _serve_run(tmp_path / "elsewhere", 0.4, 1.5)
    md, fig = sweep_report.write_sweep_report(sweep, [extra])
    assert fig.exists() and fig.stat().st_size > 0
    cells = read_json(sweep / "sweep_summary.json")["cells"]
    assert [c["request_rate"] for c in cells] == [0.05, 0.1, 0.2, 0.4]
    ttft = [c["ab"]["mean_ttft_ms"] for c in cells]
    assert [r["ratio"] for r in ttft] == pytest.approx([1.0, 1.1, 1.25, 1.5], rel=0.03)
    assert [r["verdict"] for r in ttft[1:]] == ["slower"] * 3
    table = [line for line in md.read_text().splitlines() if line.startswith("| w |")]
    assert len(table) == 4 and "slower" in table[-1] and "0.4 req/s" in table[-1]


def test_sweep_report_recomputes_a_cell_without_summary(tmp_path: Path) -> None:
    run = _serve_run(tmp_path / "s" / "0", 0.1, 1.25)
    (run / "summary.json").unlink()
    cells = sweep_report.collect(tmp_path / "s", n_boot=50)
    assert len(cells) == 1 and cells[0]["ab"]["mean_ttft_ms"]["verdict"] == "slower"
