"""The import graph runs one way: benchmarks and tests may import harness and tagma; harness may import
only tagma's contract (tagma.contract, and tagma.probes.host_time for the host-time record format, both
standard library only); tagma imports neither harness nor benchmarks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_MODULES = ("tagma.contract", "tagma.probes.host_time")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("tagma", ("harness", "benchmarks")), ("harness", ("benchmarks",))],
)
def test_no_import_runs_back_up(package: str, forbidden: tuple[str, ...]) -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in forbidden
    ]
    assert not offenders, offenders


def test_harness_sees_tagma_only_through_its_contract() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "harness").rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] == "tagma" and name not in CONTRACT_MODULES
    ]
    assert not offenders, offenders


def test_kernels_holds_only_triton_kernels() -> None:
    modules = {p.stem for p in (ROOT / "tagma" / "kernels").glob("*.py")} - {"__init__"}
    for name in modules:
        assert "import triton" in (ROOT / "tagma" / "kernels" / f"{name}.py").read_text(), name
