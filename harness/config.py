"""Typed configuration of a serve benchmark, built from the Hydra config (configs/) and validated here.

The Hydra entry point (harness/main.py) turns its DictConfig into a BenchConfig and hands it to plain
library code, which stays testable without Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.arrivals import LoadSpec
from harness.workload import WorkloadSpec
from tagma.contract import BACKENDS

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    path: str
    tokenizer: str | None = None  # defaults to the model directory
    build_tiny: bool = False  # build the tiny local model into `path` first

    @property
    def tokenizer_dir(self) -> Path:
        return Path(self.tokenizer or self.path)


@dataclass(frozen=True)
class ServerConfig:
    device: str = "cpu"
    dtype: str = "float32"
    max_model_len: int | None = None
    kv_cache_space_gib: float | None = None
    num_gpu_blocks_override: int | None = None
    startup_timeout_s: float = 900.0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"server.device must be one of {DEVICES}, got {self.device!r}")


@dataclass(frozen=True)
class RunConfig:
    repeats: int = 2
    seed: int = 0
    slos: dict[str, float] = field(default_factory=dict)  # ttft_ms / tpot_ms / e2el_ms limits
    request_timeout_s: float = 3600.0
    run_timeout_s: float = 7200.0  # a run still going after this is a hung server: marked failed
    telemetry_interval_s: float = 1.0
    n_boot: int = 2000

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"run.repeats must be >= 1, got {self.repeats}")
        for name in ("request_timeout_s", "run_timeout_s", "telemetry_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"run.{name} must be positive")


@dataclass(frozen=True)
class BenchConfig:
    model: ModelConfig
    server: ServerConfig
    workload: WorkloadSpec
    load: LoadSpec
    run: RunConfig
    out_dir: Path
    data_dir: Path
    backends: tuple[str, str] = BACKENDS

    def __post_init__(self) -> None:
        if len(self.backends) != 2 or len(set(self.backends)) != 2 or not set(self.backends) <= set(BACKENDS):
            raise ValueError(f"backends must be two distinct of {BACKENDS}, got {self.backends}")
        if self.server.max_model_len is not None and self.workload.max_model_len > self.server.max_model_len:
            raise ValueError(
                f"workload needs max_model_len {self.workload.max_model_len} but the server allows "
                f"{self.server.max_model_len}"
            )


def from_mapping(cfg: dict[str, Any]) -> BenchConfig:
    """Build from the resolved config as a plain dict (OmegaConf.to_container with resolve=True)."""
    server = dict(cfg["server"])
    server["extra_args"] = tuple(server.get("extra_args") or ())
    server["env"] = {str(k): str(v) for k, v in (server.get("env") or {}).items()}
    workload = dict(cfg["workload"])
    workload.setdefault("max_model_len", server.get("max_model_len"))
    return BenchConfig(
        model=ModelConfig(**cfg["model"]),
        server=ServerConfig(**server),
        workload=WorkloadSpec.from_dict(workload),
        load=LoadSpec(**cfg["load"]),
        run=RunConfig(**{**cfg["run"], "slos": dict(cfg["run"].get("slos") or {})}),
        out_dir=Path(cfg["out_dir"]),
        data_dir=Path(cfg["data_dir"]),
        backends=tuple(cfg.get("backends", BACKENDS)),
    )
