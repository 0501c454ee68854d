"""Typed configuration of a serve benchmark, built from the Hydra config (configs/) and validated here.

The Hydra entry point (harness/main.py) turns its DictConfig into a BenchConfig and hands it to plain
library code, which stays testable without Hydra.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.workload.arrivals import LoadSpec
from harness.workload.spec import WorkloadSpec
from tagma.contract import BACKENDS

DEVICES = ("cpu", "cuda")
DESIGNS = ("abba", "paired")  # the keys of harness.designs.registry.DESIGNS (checked there)
ARM_NAMES = ("baseline", "candidate")
DEFAULT_PRIMARY = ("mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "p90_tpot_ms", "output_throughput")


@dataclass(frozen=True)
class Arm:
    """One side of an A/B: its name in the report (baseline or candidate) and the backend it serves.

    An A/A gives both arms the same backend; the names keep them apart in files and tables."""

    name: str
    backend: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.backend})"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    path: str
    tokenizer: str | None = None  # defaults to the model directory
    build_tiny: bool = False  # build the tiny local model into `path` first
    family: str = "llama"  # which tiny model build_tiny builds (harness.serve.tiny_families)
    dtype: str | None = None  # the dtype the model needs (vLLM for CPU: MoE, GDN, MLA want bfloat16)
    # Server arguments the model needs on both arms, after server.extra_args (sliding-window models:
    # --no-enable-prefix-caching, the configuration tagma serves them in)
    server_args: tuple[str, ...] = ()

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
    # The whole harness path against the mock server, one per arm: checks the run's plumbing where vLLM or
    # the device is missing. Its numbers time the mock, and the report and summary say so.
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"server.device must be one of {DEVICES}, got {self.device!r}")


@dataclass(frozen=True)
class RunConfig:
    """How the A/B is run and judged.

    ``design``: ``abba`` starts one server at a time, ``repeats`` lifetimes per arm in ABBA order (any
    concurrency); ``paired`` keeps one server of each arm up at once and sends each prompt to both, one
    wave of ``load.max_concurrency`` prompts (closed loop) to one server at a time, alternating which arm
    goes first, ``repeats`` rounds of fresh server pairs.
    ``primary_metrics`` get a verdict under a family-wise (Holm) correction at level ``alpha``; every other
    metric is descriptive. ``pin_client`` keeps the client off the cores vLLM binds its compute threads to;
    ``pin_server_host`` moves the server's host processes (API server, engine core) off them too, leaving the
    model worker's compute core to the worker alone.
    ``host_time`` records in-server CPU time per scheduler step on both arms; ``host_time_groups`` adds, for a
    model with several KV cache groups, the KV manager's time per group (nested timers: the regime maps
    leave them off so that their manager totals are measured as before).
    ``quiet_loadavg``: a run that starts with a 1-minute load average above this is flagged as under load.
    ``warmup_lifetimes`` (``abba``): unmeasured server lifetimes before the first measured one; the first
    lifetime of a series ran slower than the rest, and ABBA gives that slot to the baseline.
    ``pair_gap_s`` (``paired``): the pause before a pair's second request, sent to the other server. A vLLM
    reader busy-waits (``sched_yield``) for 1 s after its last read; on this 2-core machine a request sent to
    the other server inside that second waited 0.5-1 s for its first token, on one server of the two only.
    """

    design: str = "abba"
    repeats: int = 2
    seed: int = 0
    slos: dict[str, float] = field(default_factory=dict)  # ttft_ms / tpot_ms / e2el_ms limits
    request_timeout_s: float = 3600.0
    run_timeout_s: float = 7200.0  # a run still going after this is a hung server: marked failed
    telemetry_interval_s: float = 1.0
    n_boot: int = 2000
    primary_metrics: tuple[str, ...] = DEFAULT_PRIMARY
    alpha: float = 0.05
    pin_client: bool = True
    pin_server_host: bool = False
    host_time: bool = True
    host_time_groups: bool = True
    quiet_loadavg: float = 0.5
    warmup_lifetimes: int = 1
    pair_gap_s: float = 1.5

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise ValueError(f"run.design must be one of {DESIGNS}, got {self.design!r}")
        if self.pair_gap_s < 0:
            raise ValueError(f"run.pair_gap_s must be >= 0, got {self.pair_gap_s}")
        if self.warmup_lifetimes < 0:
            raise ValueError(f"run.warmup_lifetimes must be >= 0, got {self.warmup_lifetimes}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"run.alpha must be in (0, 1), got {self.alpha}")
        object.__setattr__(self, "primary_metrics", tuple(self.primary_metrics))
        if self.repeats < 1:
            raise ValueError(f"run.repeats must be >= 1, got {self.repeats}")
        for name in ("request_timeout_s", "run_timeout_s", "telemetry_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"run.{name} must be positive")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunConfig:
        """From the ``run`` mapping: keys it lacks take the defaults above; unknown keys are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["slos"] = dict(kw.get("slos") or {})
        kw["primary_metrics"] = tuple(kw.get("primary_metrics") or DEFAULT_PRIMARY)
        return cls(**kw)


@dataclass(frozen=True)
class BenchConfig:
    model: ModelConfig
    server: ServerConfig
    workload: WorkloadSpec
    load: LoadSpec
    run: RunConfig
    out_dir: Path
    data_dir: Path
    backends: tuple[str, str] = BACKENDS  # (baseline, candidate); equal for an A/A

    def __post_init__(self) -> None:
        if len(self.backends) != 2 or not set(self.backends) <= set(BACKENDS):
            raise ValueError(
                f"backends must be [baseline, candidate], each one of {BACKENDS} (equal for an A/A), "
                f"got {list(self.backends)}"
            )
        if self.run.design == "paired" and self.load.mode != "closed":
            raise ValueError(
                "run.design=paired sends waves of load.max_concurrency prompts to one of two live servers at "
                f"a time: use load=closed (got load.mode={self.load.mode}; use run.design=abba for open-loop "
                "and trace loads, where two live servers would compete for the cores)"
            )
        if self.load.mode == "trace" and self.workload.kind != "mooncake":
            raise ValueError(f"load=trace sends requests at a trace's times: it needs a trace workload "
                             f"(workload=mooncake, or workload.dataset=<trace file>), got "
                             f"{self.workload.kind} workload {self.workload.name}")
        wl, srv = self.workload.max_model_len, self.server.max_model_len
        if srv is not None and wl is not None and wl > srv:
            raise ValueError(
                f"workload needs max_model_len {self.workload.max_model_len} but the server allows "
                f"{self.server.max_model_len}"
            )

    @property
    def arms(self) -> tuple[Arm, Arm]:
        return Arm(ARM_NAMES[0], self.backends[0]), Arm(ARM_NAMES[1], self.backends[1])

    @property
    def is_aa(self) -> bool:
        return self.backends[0] == self.backends[1]

    def with_max_model_len(self, max_model_len: int) -> BenchConfig:
        """This config with the server's context (and the workload's bound) set to ``max_model_len``."""
        return dataclasses.replace(
            self,
            server=dataclasses.replace(self.server, max_model_len=max_model_len),
            workload=dataclasses.replace(self.workload, max_model_len=max_model_len),
        )


def from_mapping(cfg: dict[str, Any]) -> BenchConfig:
    """Build from the resolved config as a plain dict (OmegaConf.to_container with resolve=True)."""
    server = dict(cfg["server"])
    server["extra_args"] = tuple(server.get("extra_args") or ())
    server["env"] = {str(k): str(v) for k, v in (server.get("env") or {}).items()}
    workload = dict(cfg["workload"])
    workload.setdefault("max_model_len", server.get("max_model_len"))
    model = dict(cfg["model"])
    model["server_args"] = tuple(str(a) for a in model.get("server_args") or ())
    return BenchConfig(
        model=ModelConfig(**model),
        server=ServerConfig(**server),
        workload=WorkloadSpec.from_dict(workload),
        load=LoadSpec(**cfg["load"]),
        run=RunConfig.from_dict(cfg["run"]),
        out_dir=Path(cfg["out_dir"]),
        data_dir=Path(cfg["data_dir"]),
        backends=tuple(cfg.get("backends", BACKENDS)),
    )


@dataclass(frozen=True)
class SavedConfig:
    """What the analysis reads of a run directory's config.json (the resolved config harness.main wrote),
    typed: ``run`` and ``backends`` with the dataclasses' defaults for keys an older run did not write;
    ``raw`` is the whole file, for what is only shown or matched (model, load, workload name, inserver)."""

    run: RunConfig = field(default_factory=RunConfig)
    backends: tuple[str, str] = BACKENDS
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def arms(self) -> tuple[Arm, Arm]:
        return Arm(ARM_NAMES[0], self.backends[0]), Arm(ARM_NAMES[1], self.backends[1])

    @property
    def is_aa(self) -> bool:
        return self.backends[0] == self.backends[1]

    def section(self, name: str) -> Mapping[str, Any]:
        """A section of the file other than run (e.g. load, workload, model, inserver); {} when absent."""
        return self.raw.get(name) or {}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SavedConfig:
        return cls(run=RunConfig.from_dict(d.get("run") or {}), backends=tuple(d.get("backends", BACKENDS)),
                   raw=d)  # fmt: skip

    @classmethod
    def of(cls, config: SavedConfig | Mapping[str, Any]) -> SavedConfig:
        """``config`` as a SavedConfig (a mapping is read as a config.json's contents)."""
        return config if isinstance(config, SavedConfig) else cls.from_dict(config)

    @classmethod
    def load(cls, run_dir: Path) -> SavedConfig:
        """The typed config of a serve run directory."""
        return cls.from_dict(json.loads((Path(run_dir) / "config.json").read_text()))
