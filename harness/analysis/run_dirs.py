"""What a results directory is: a serve run, or a tree of them (a sweep). Readers find runs here."""

from __future__ import annotations

from pathlib import Path

__all__ = ["find_serve_runs", "is_serve_run"]


def is_serve_run(run_dir: Path) -> bool:
    """A serve run directory: its resolved ``config.json`` and one ``runs/`` subdirectory per server run."""
    return (run_dir / "config.json").exists() and (run_dir / "runs").is_dir()


def find_serve_runs(root: Path, max_depth: int = 3) -> list[Path]:
    """Serve run directories at or below ``root``, sorted (symlinks such as ``latest`` are skipped).

    Args:
        root: a serve run, or a directory holding serve runs up to ``max_depth`` levels down.
        max_depth: how many directory levels below ``root`` are searched.

    Returns:
        The run directories; ``[root]`` when ``root`` itself is one.
    """
    root = Path(root)
    if is_serve_run(root):
        return [root]
    found: list[Path] = []
    frontier = [root]
    for _ in range(max_depth):
        nxt = []
        for d in frontier:
            for sub in sorted(p for p in d.iterdir() if p.is_dir() and not p.is_symlink()):
                (found if is_serve_run(sub) else nxt).append(sub)
        frontier = nxt
    return sorted(found)
