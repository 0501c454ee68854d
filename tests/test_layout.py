"""The house rules, checked on the source: the import graph runs one way (benchmarks and tests may import
harness and tagma; harness only tagma's contract modules; tagma neither) and has no circle between modules;
no Python file over 600 lines, no function over 120 (benchmark report tables excepted); every TAGMA_*
environment name is spelled in tagma/contract.py alone."""

from __future__ import annotations

import ast
import re
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


# ---- the module graph: no circles anywhere, no arrow back up between the top rooms

PACKAGES = ("tagma", "harness", "benchmarks")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 120
# benchmark report tables: one long literal table per section, read as a table
FUNCTION_LIMIT_EXEMPT = ("benchmarks/host/report/",)
TAGMA_ENV_NAME = re.compile(r"\bTAGMA_(?!E_|OK\b)[A-Z][A-Z0-9_]*")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_imports(path: Path, modules: set[str]) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports inside functions count), resolved to the
    project's own modules: ``from a.b import c`` names ``a.b.c`` where that is a module, else ``a.b``."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != me}


def _module_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: _all_imports(path, set(paths)) for name, path in paths.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_module_graph_has_no_circle() -> None:
    assert _cycles(_module_graph()) == []


def test_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _python_files() -> list[Path]:
    return sorted(p for pkg in (*PACKAGES, "tests") for p in (ROOT / pkg).rglob("*.py"))


def test_no_python_file_over_the_line_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, long


def test_no_function_over_the_line_limit() -> None:
    long = [
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for p in _python_files()
        if not str(p.relative_to(ROOT)).startswith(FUNCTION_LIMIT_EXEMPT)
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, long


def _docstrings(tree: ast.AST) -> set[int]:
    return {
        id(body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and (body := node.body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    }


def env_names_spelled(source: str) -> list[str]:
    """The TAGMA_* environment names a module spells in a string literal (docstrings are prose, not names;
    the engine's status names TAGMA_OK / TAGMA_E_* mirror its C header and are not environment names)."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    return sorted(
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
        for name in TAGMA_ENV_NAME.findall(node.value)
    )


def test_env_names_are_spelled_only_in_the_contract() -> None:
    exempt = (ROOT / "tagma" / "contract.py", Path(__file__).resolve())  # the names; this file's own examples
    spelled = {
        str(p.relative_to(ROOT)): names
        for p in _python_files()
        if p not in exempt and (names := env_names_spelled(p.read_text()))
    }
    assert not spelled, spelled


def test_env_name_finder_sees_literals_and_f_strings_but_not_prose() -> None:
    src = 'def f():\n    """TAGMA_DOC."""\n'
    src += '    return "TAGMA_X", f"{1}TAGMA_Y=1", "TAGMA_E_NO_SPACE", "TAGMA_OK"\n'
    assert env_names_spelled(src) == ["TAGMA_X", "TAGMA_Y"]
