"""`python -m harness.gpu_preflight MODEL [overrides]`: `make bench-gpu`'s first step. Every check of the
GPU profile that needs no GPU, then one line about the GPU.

Per GPU workload (``sharegpt_16k``, ``sharegpt_128k``):

1. the run's Hydra config composes (``model=llama31_8b_gpu model.path=MODEL server=gpu workload=W`` and the
   overrides given, as ``make bench-gpu`` passes them);
2. the checkpoint's context (its ``config.json``, RoPE scaling and tokenizer limit) holds the workload;
3. the workload builds with the checkpoint's tokenizer, into the cache the run then reads.

Once, for the checkpoint: `--kv-cache-backend tagma` parses in vLLM's own serve parser, and vLLM's engine
config for the checkpoint (its config only: no weights load) passes tagma's fail-closed checks.

Then the GPU (:mod:`harness.serve.gpu_check`): a GPU and a CUDA vLLM give exit 0 and the run goes on; else
one line saying what is missing and exit 2. A failed check is one line naming it, exit 1.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from harness.config import BenchConfig, from_mapping
from harness.serve.gpu_check import problems as gpu_problems
from tagma.contract import PREFLIGHT_MODULE

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GPU_WORKLOADS = ("sharegpt_16k", "sharegpt_128k")
EXIT_NO_GPU = 2


class PreflightError(RuntimeError):
    """A check failed; the message names it."""


@dataclass(frozen=True)
class Checked:
    what: str
    detail: str


def compose_gpu_run(model_dir: Path, workload: str, overrides: Sequence[str] = ()) -> BenchConfig:
    from hydra import compose, initialize_config_dir

    run = ["model=llama31_8b_gpu", f"model.path={model_dir}", "server=gpu", f"workload={workload}",
           f"repo_dir={Path.cwd()}"]  # what ${hydra:runtime.cwd} gives the run  # fmt: skip
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="bench", overrides=[*run, *overrides])
    return from_mapping(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def check_workload(
    model_dir: Path, workload: str, overrides: Sequence[str]
) -> tuple[BenchConfig, list[Checked]]:
    from harness.main import resolve_context
    from harness.serve.model_context import ContextError
    from harness.workload.registry import build_workload

    try:
        cfg = compose_gpu_run(model_dir, workload, overrides)
    except Exception as e:  # Hydra's and the config's own errors, each with its message
        raise PreflightError(f"{workload}: the config does not compose: {e}") from e
    try:
        cfg = resolve_context(cfg)
    except ContextError as e:
        raise PreflightError(f"{workload}: {e}") from e
    done = [Checked(f"{workload} config", f"composes, max_model_len {cfg.server.max_model_len}")]
    try:
        wl = build_workload(cfg.workload, cfg.model.tokenizer_dir, cfg.data_dir / "workloads")
    except Exception as e:
        raise PreflightError(
            f"{workload}: the workload does not build with {cfg.model.tokenizer_dir}: {e}"
        ) from e
    lengths = wl.prompt_lengths()
    done.append(
        Checked(f"{workload} workload", f"{len(lengths)} prompts, {min(lengths)}-{max(lengths)} tokens")
    )
    return cfg, done


def check_tagma(model_dir: Path, max_model_len: int) -> list[Checked]:
    """tagma's own check (its plugin's flag, its fail-closed checks on the checkpoint's engine config), in a
    process of its own: the harness sees tagma only through its contract."""
    cmd = [sys.executable, "-m", PREFLIGHT_MODULE, str(model_dir)]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    line = (done.stdout.strip() or done.stderr.strip() or "no output").splitlines()[-1]
    if done.returncode != 0:
        raise PreflightError(line)
    return [Checked("tagma", line)]


def preflight(model_dir: Path, overrides: Sequence[str] = ()) -> list[Checked]:
    done: list[Checked] = []
    longest = 0
    for workload in GPU_WORKLOADS:
        cfg, checked = check_workload(model_dir, workload, overrides)
        done += checked
        longest = max(longest, cfg.server.max_model_len or 0)
    return done + check_tagma(model_dir, longest)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: python -m harness.gpu_preflight MODEL_DIR [hydra overrides]", file=sys.stderr)
        return 1
    model_dir = Path(args[0]).resolve()
    if not (model_dir / "config.json").is_file():
        print(f"bench-gpu: {model_dir} has no config.json: give a checkpoint directory", file=sys.stderr)
        return 1
    try:
        done = preflight(model_dir, args[1:])
    except PreflightError as e:
        print(f"bench-gpu: check failed: {e}", file=sys.stderr)
        return 1
    for c in done:
        print(f"ok  {c.what}: {c.detail}")
    if missing := gpu_problems():
        print(
            f"bench-gpu: every check without a GPU passed; stopping here: {'; '.join(missing)}",
            file=sys.stderr,
        )
        return EXIT_NO_GPU
    print("GPU and CUDA vLLM found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
