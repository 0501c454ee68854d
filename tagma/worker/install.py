"""Installs the worker's KV write path (slot mapping from range descriptors), one entry per model runner.

:data:`MODEL_RUNNERS` maps a vLLM model runner to the module that serves it and that module's install,
uninstall and installed functions. Modules are imported on install only: the V2 entry needs Triton, which
the CPU path must never import. A new model runner is one module plus one entry.
"""

from __future__ import annotations

import importlib
import sys
from typing import Final, NamedTuple

__all__ = ["MODEL_RUNNERS", "V1", "V2", "WritePath", "install", "installed", "model_runners", "uninstall"]

V1: Final = "v1"
V2: Final = "v2"


class WritePath(NamedTuple):
    """A model runner's write path: the module and the names of its install, uninstall and installed."""

    module: str
    install: str
    uninstall: str
    installed: str


MODEL_RUNNERS: dict[str, WritePath] = {
    # V1 is installed under either runner (as the write path always was); V2 only under Model Runner V2.
    V1: WritePath("tagma.worker.block_table_v1", "install_v1", "uninstall_v1", "installed_v1"),
    V2: WritePath("tagma.worker.block_tables_v2", "install_v2", "uninstall_v2", "installed_v2"),
}


def model_runners(use_v2_model_runner: bool) -> tuple[str, ...]:
    """The write paths a worker installs: V1 always, V2 too under Model Runner V2."""
    return (V1, V2) if use_v2_model_runner else (V1,)


def install(use_v2_model_runner: bool) -> None:
    """Route the worker's KV-write slot mapping through range descriptors (idempotent)."""
    for name in model_runners(use_v2_model_runner):
        entry = MODEL_RUNNERS[name]
        getattr(importlib.import_module(entry.module), entry.install)()


def uninstall() -> None:
    """Undo :func:`install` (tests); a write path whose module was never imported was never installed."""
    for entry in MODEL_RUNNERS.values():
        module = sys.modules.get(entry.module)
        if module is not None:
            getattr(module, entry.uninstall)()


def installed() -> bool:
    """Whether Model Runner V1's write path is installed."""
    entry = MODEL_RUNNERS[V1]
    return bool(getattr(importlib.import_module(entry.module), entry.installed)())
