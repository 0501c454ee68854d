"""`python -m tagma.preflight MODEL [--max-model-len N]`: would tagma serve this checkpoint? (No weights.)

`--kv-cache-backend tagma` must parse in vLLM's own serve parser (the plugin registers), and vLLM's engine
config for the checkpoint (built from its config files: no weights load, no device is touched) must pass
tagma's fail-closed checks. Prints one line; exit 0 when tagma would serve it, 1 when not (the line says
why). `make bench-gpu` runs it (through ``harness.gpu_preflight``) before anything needs a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tagma.contract import CLI_FLAG, TAGMA


def serve_parser() -> Any:
    """vLLM's own `vllm serve` argument parser (its module moved between vLLM 0.32 and 0.33)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # vLLM 0.33
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.32
    return make_arg_parser(FlexibleArgumentParser())


def problems(model: str, max_model_len: int | None) -> list[str]:
    from tagma.serve import install_version_alias

    install_version_alias()
    from vllm.engine.arg_utils import EngineArgs

    from tagma import fail_closed
    from tagma.plugin import register

    register()
    args = serve_parser().parse_args(["--model", model, CLI_FLAG, TAGMA])
    if getattr(args, "kv_cache_backend", None) != TAGMA:
        return [f"the plugin's {CLI_FLAG} did not parse in vLLM's serve parser"]
    try:
        config = EngineArgs(model=model, max_model_len=max_model_len).create_engine_config()
    except Exception as e:  # vLLM's own errors about the checkpoint, each with its message
        return [f"vLLM cannot build an engine config for {model}: {e}".replace("\n", " ")]
    if refused := fail_closed.unsupported_features(config):
        return [f"tagma refuses this checkpoint: {'; '.join(refused)}"]
    return []


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tagma.preflight", description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--max-model-len", type=int, default=None)
    a = p.parse_args(argv)
    found = problems(a.model, a.max_model_len)
    if found:
        print("; ".join(found))
        return 1
    print(f"{CLI_FLAG} {TAGMA} parses; the checkpoint's engine config passes tagma's fail-closed checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
