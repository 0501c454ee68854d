"""The KV cache backend selector: `--kv-cache-backend {paged,tagma}` and its single source of truth.

The choice lives in ``vllm_config.additional_config["kv_cache_backend"]``: vLLM ships that dict to every
process (engine core, workers), so each one reads the same answer. The CLI flag is only a spelling of that
entry; ``paged`` (stock vLLM) is the default when neither is given.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any, Final

from tagma.contract import (
    BACKENDS,
    CLI_FLAG,
    CONFIG_KEY,
    DEFAULT_RANGE_MANAGER,
    ENV_RANGE_MANAGER,
    PAGED,
    TAGMA,
)
from tagma.errors import TagmaConfigError

__all__ = [
    "BACKENDS", "CLI_FLAG", "CONFIG_KEY", "PAGED", "SCHEDULER_QUALNAME", "TAGMA", "TagmaConfigError",
    "range_manager_enabled",
]  # fmt: skip

CLI_DEST: Final = CONFIG_KEY
# What scheduler_config.scheduler_cls names once tagma is selected (see tagma.core.scheduler).
SCHEDULER_QUALNAME: Final = "tagma.core.scheduler.TagmaScheduler"


def range_manager_enabled() -> bool:
    """Whether tagma's range-native managers serve (prefix caching off or on): ``$TAGMA_RANGE_MANAGER`` != 0.
    The one reading of the variable: the plugin's refusals and the manager registry both ask here."""
    return os.environ.get(ENV_RANGE_MANAGER, DEFAULT_RANGE_MANAGER).strip() != "0"


def add_cli_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--kv-cache-backend`` to a vLLM engine-args parser (no-op when it is already there)."""
    if any(CLI_FLAG in action.option_strings for action in parser._actions):
        return
    parser.add_argument(
        CLI_FLAG,
        dest=CLI_DEST,
        choices=BACKENDS,
        default=None,
        help=f"KV cache backend: '{PAGED}' (default: stock vLLM) or '{TAGMA}' (contiguous ranges). "
        f"Same as --additional-config '{{\"{CONFIG_KEY}\": \"{TAGMA}\"}}'.",
    )


def merge_cli_choice(additional_config: Any, cli_choice: str | None) -> Any:
    """``additional_config`` with the CLI choice recorded; raises on a conflicting explicit entry."""
    if cli_choice is None:
        return additional_config
    current = dict(additional_config or {})
    explicit = current.get(CONFIG_KEY)
    if explicit is not None and explicit != cli_choice:
        raise TagmaConfigError(
            f"tagma: conflicting KV cache backends: {CLI_FLAG} {cli_choice} but additional_config "
            f"{CONFIG_KEY}={explicit!r}; give one of them"
        )
    current[CONFIG_KEY] = cli_choice
    return current


def backend_of(additional_config: Any) -> str:
    """The backend named by an ``additional_config`` value (``paged`` when absent); validates it."""
    value = additional_config.get(CONFIG_KEY) if isinstance(additional_config, Mapping) else None
    if value is None:
        return PAGED
    if value not in BACKENDS:
        raise TagmaConfigError(
            f"tagma: unknown {CONFIG_KEY} {value!r}; expected one of: {', '.join(BACKENDS)}"
        )
    return value


def selected_backend(vllm_config: Any) -> str:
    """The backend a VllmConfig selects."""
    return backend_of(getattr(vllm_config, "additional_config", None))


def is_tagma(vllm_config: Any) -> bool:
    return selected_backend(vllm_config) == TAGMA
