"""`python -m harness.serve.gpu_check`: exit non-zero with a clear message unless a GPU and a CUDA vLLM are
here."""

from __future__ import annotations

import importlib.metadata
import sys

from tagma.contract import ENV_VLLM_BUILD


def problems() -> list[str]:
    found: list[str] = []
    try:
        import torch
    except ImportError:
        return [f"torch is not installed (run `make setup {ENV_VLLM_BUILD}=gpu`)"]
    if not torch.cuda.is_available():
        found.append(f"no CUDA GPU visible to torch {torch.__version__}")
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None:
        setup = f"make setup {ENV_VLLM_BUILD}=gpu"
        found.append(f"the CUDA vLLM is not installed (`{setup}` installs vllm 0.33.0)")
    elif "cpu" in version:
        found.append(f"installed vLLM {version} is a CPU build")
    return found


def main() -> None:
    found = problems()
    if found:
        sys.exit("bench-gpu needs a GPU machine: " + "; ".join(found))
    print("GPU and CUDA vLLM found")


if __name__ == "__main__":
    main()
