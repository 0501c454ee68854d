"""The device a GPU kernel run measures on: versions, peak and achieved memory bandwidth."""

from __future__ import annotations

import platform
import sys
from typing import Any

from benchmarks.gpu.settings import Settings

# Peak DRAM bandwidth (GB/s) by device-name substring, most specific first (vendor datasheets).
PEAK_GBPS = (
    ("GH200", 4000.0), ("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0),
    ("H800", 3350.0), ("H20", 4000.0), ("B200", 8000.0), ("B100", 8000.0),
    ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0), ("A800", 2039.0),
    ("L40S", 864.0), ("L40", 864.0), ("L4", 300.0), ("A10G", 600.0), ("A10", 600.0),
    ("RTX 6000 Ada", 960.0), ("RTX 4090", 1008.0), ("V100", 900.0), ("T4", 320.0),
)  # fmt: skip

def check_device(s: Settings) -> None:
    import torch

    if s.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            f"gpu_kernels: no CUDA GPU visible to torch {torch.__version__}; this benchmark needs one. "
            "`python -m benchmarks.gpu --dry-run` runs the pipeline on CPU under Triton's interpreter"
        )
    try:
        import triton  # noqa: F401
    except ImportError:
        sys.exit("gpu_kernels: Triton is not installed")



def peak_gbps(name: str) -> float | None:
    return next((gbps for key, gbps in PEAK_GBPS if key in name), None)


def machine(s: Settings) -> dict[str, Any]:
    import torch
    import triton

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "platform": platform.platform(),
    }
    try:
        from harness.serve.environment import environment, git_state

        info["git"] = git_state()
        info["environment"] = environment()
    except ImportError as exc:  # a bare GPU box without the harness's dependencies
        info["environment_error"] = str(exc)
    if s.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_bytes=props.total_memory,
            peak_gbps=peak_gbps(props.name),
            peak_source="datasheet table in benchmarks/gpu/machine.py",
            copy_gbps=copy_bandwidth(),
        )
    else:
        info.update(device="cpu (Triton interpreter)", peak_gbps=None, copy_gbps=None)
    return info


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write): what the memory system achieves."""
    import torch
    import triton.testing

    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


