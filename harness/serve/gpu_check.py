"""`python -m harness.serve.gpu_check`: exit non-zero with a clear message unless a GPU and a CUDA vLLM are
here."""

from __future__ import annotations

import importlib.metadata
import sys


def problems() -> list[str]:
    found: list[str] = []
    try:
        import torch
    except ImportError:
        return ["torch is not installed (run `make setup TAGMA_VLLM=gpu`)"]
    if not torch.cuda.is_available():
        found.append(f"no CUDA GPU visible to torch {torch.__version__}")
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None:
        found.append("the CUDA vLLM is not installed (`make setup TAGMA_VLLM=gpu` installs vllm 0.33.0)")
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
