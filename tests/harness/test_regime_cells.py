"""The regime map's cells and profiles: grid expansion, sizing, validation; every shipped profile composes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.regime.cells import CellSpec, GroupSpec, MapSpec, expand_grid
from harness.regime.main import jobs, map_spec

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PROFILES = sorted(p.stem for p in (CONFIGS / "regime").glob("*.yaml"))


def grid(**kw: object) -> dict:
    base = {
        "prompt_tokens": [1024, 4096],
        "concurrency": [1, 8],
        "output_tokens": 32,
        "sizing": {"waves": 2, "min_requests": 4},
        "knee_concurrency": 8,
        "knee_fractions": [0.5, 0.9],
    }
    return {**base, **kw}


def test_grid_expands_closed_then_open_cells_per_prompt_length() -> None:
    cells = expand_grid(grid())
    names = [c.name for c in cells]
    assert names == [
        "c1-p1024",
        "c8-p1024",
        "open0.5-p1024",
        "open0.9-p1024",
        "c1-p4096",
        "c8-p4096",
        "open0.5-p4096",
        "open0.9-p4096",
    ]
    by = {c.name: c for c in cells}
    assert by["c1-p1024"].num_requests == 4 and by["c8-p1024"].num_requests == 16  # max(min, waves x c)
    assert by["open0.9-p4096"].rate_from == "c8-p4096" and by["open0.9-p4096"].load == "open"
    assert len({c.seed for c in cells}) == len(cells)  # distinct prompts per cell


def test_prompt_token_cap_shrinks_waves_but_never_below_one_wave() -> None:
    cells = expand_grid(
        grid(
            prompt_tokens=[16384],
            concurrency=[8, 32],
            sizing={"waves": 4, "min_requests": 1, "max_prompt_tokens": 16384 * 10},
        )
    )
    by = {c.name: c.num_requests for c in cells}
    assert by["c8-p16384"] == 10 and by["c32-p16384"] == 32


def test_skip_drops_a_cell_and_the_open_cells_that_need_it() -> None:
    names = [c.name for c in expand_grid(grid(skip=["c8-p4096"]))]
    assert "c8-p4096" not in names and not any(n.endswith("p4096") and n.startswith("open") for n in names)


def test_trace_cells_keep_their_workload_fields() -> None:
    (cell,) = expand_grid(
        {"traces": [{"cell": "mooncake", "num_requests": 5, "output_tokens": 16, "time_scale": 2.0}]}
    )
    assert cell.load == "trace" and cell.trace == {"num_requests": 5, "time_scale": 2.0}
    assert cell.output_tokens == 16


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"load": "closed", "prompt_tokens": 100}, "concurrency"),
        ({"load": "open", "prompt_tokens": 100, "knee_fraction": 0.5}, "rate_from"),
        ({"load": "bursty", "prompt_tokens": 100}, "load must be"),
        ({"load": "trace"}, "trace workload"),
        ({"load": "closed", "prompt_tokens": 100, "concurrency": 1, "name": "a/b"}, "cell name"),
    ],
)
def test_bad_cells_are_refused_with_the_reason(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CellSpec(**{"name": "x", **kw})


def test_a_group_refuses_an_open_cell_before_its_source_and_a_prompt_over_its_context() -> None:
    closed = CellSpec(name="c1", load="closed", prompt_tokens=1000, concurrency=1)
    open_ = CellSpec(name="o", load="open", prompt_tokens=1000, knee_fraction=0.5, rate_from="c1")
    with pytest.raises(ValueError, match="listed before it"):
        GroupSpec(
            name="g", prefix_caching=False, cells=(open_, closed), max_model_len=4096, kv_cache_space_gib=1
        )
    with pytest.raises(ValueError, match="context"):
        GroupSpec(name="g", prefix_caching=False, cells=(closed,), max_model_len=1000, kv_cache_space_gib=1)
    g = GroupSpec(
        name="g", prefix_caching=True, cells=(closed, open_), max_model_len=4096, kv_cache_space_gib=1
    )
    assert g.server_args()[0] == "--enable-prefix-caching"


def test_a_map_refuses_an_aa_of_an_unknown_group() -> None:
    g = GroupSpec(
        name="g",
        prefix_caching=False,
        max_model_len=4096,
        kv_cache_space_gib=1,
        cells=(CellSpec(name="c1", load="closed", prompt_tokens=10, concurrency=1),),
    )
    with pytest.raises(ValueError, match="aa_groups"):
        MapSpec(profile="p", groups=(g,), aa_groups=("h",))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_composes_and_its_sweep_lists_its_jobs(profile: str) -> None:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="regime_map", overrides=[f"regime={profile}"], return_hydra_config=True)
    from omegaconf import OmegaConf

    regime = OmegaConf.to_container(cfg.regime, resolve=True)
    spec = map_spec(regime)
    sweep = str(cfg.hydra.sweeper.params.job).split(",")
    # every job, or (a calibration profile such as aa_order) its A/As only
    assert sweep in (jobs(spec), [j for j in jobs(spec) if j.endswith("-aa")])
    assert cfg.job in sweep


def test_the_xxhash_profile_gives_the_baseline_vllms_fastest_hash() -> None:
    """The strongest baseline for prefix caching: vLLM's xxhash block hash reaches the servers of the
    profile's group (both arms; tagma's prefix index hashes nothing), caching on, and its A/A runs too."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="regime_map", overrides=["regime=xxhash"])
    from omegaconf import OmegaConf

    spec = map_spec(OmegaConf.to_container(cfg.regime, resolve=True))
    (group,) = spec.groups
    args = group.server_args()
    assert group.prefix_caching and "--enable-prefix-caching" in args
    assert args[args.index("--prefix-caching-hash-algo") + 1] == "xxhash"
    assert spec.aa_groups == (group.name,)


@pytest.mark.parametrize(
    ("profile", "cachings", "calibrated"),
    [
        ("hybrid", (False,), (True,)),
        ("hybrid_cached", (True,), (True,)),
        ("hybrid_long", (False,), (True,)),
        ("hybrid_16k", (False,), (True,)),
        ("hybrid_wide", (False, True), (False, True)),
        ("hybrid_long_wide", (False, True), (True, False)),
        ("hybrid_focus", (False,), (True,)),
    ],
)
def test_the_hybrid_profiles_serve_the_tiny_gpt_oss_caching_off_and_on(
    profile: str, cachings: tuple[bool, ...], calibrated: tuple[bool, ...]
) -> None:
    """The hybrid cells run the gpt-oss-shaped model (two KV cache groups: window 128 + full) on both arms,
    caching off (profile hybrid) or on (hybrid_cached: the group prefix manager), both (hybrid_wide: the
    quick map's grid, the A/A of the caching-on group), and their A/As run too; every closed and open
    cell's requests run past the window (hybrid_long: 4K prompts, hybrid_16k: 16K; hybrid_long_wide: 1K
    and 4K at concurrency 128, 16K at 1, 8 and open-loop; hybrid_focus: the largest host share, 1K x 1 and
    8), within the model length. The model's own args leave caching to the profile."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="regime_map", overrides=[f"regime={profile}"])
    from omegaconf import OmegaConf

    from harness.serve.tiny_families import FAMILIES

    assert cfg.model.family == "gpt-oss" and cfg.model.dtype == "bfloat16"
    assert not any("prefix-caching" in a for a in cfg.model.server_args)
    spec = map_spec(OmegaConf.to_container(cfg.regime, resolve=True))
    assert len(spec.groups) == len(cachings)
    window = FAMILIES["gpt-oss"].shape["sliding_window"]
    for group, caching, aa in zip(spec.groups, cachings, calibrated, strict=True):
        flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
        assert group.prefix_caching == caching and flag in group.server_args()
        assert (group.name in spec.aa_groups) == aa
        grid = [c for c in group.cells if c.load != "trace"]
        assert grid and all(c.prompt_tokens > window for c in grid)
        assert all(c.prompt_tokens + c.output_tokens <= group.max_model_len for c in grid)


def test_long_open_puts_the_llamas_16k_open_cells_after_their_closed_rate() -> None:
    """long_open: the tiny Llama's 16K open-loop cells (left out of long_wide), caching off and on, each at
    0.8x the rate its job measures first in the closed cell at concurrency 8, within the model length; the
    caching-off group's A/A runs too."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name="regime_map", overrides=["regime=long_open"])
    from omegaconf import OmegaConf

    assert cfg.model.name == "tiny-llama"
    spec = map_spec(OmegaConf.to_container(cfg.regime, resolve=True))
    assert [g.prefix_caching for g in spec.groups] == [False, True]
    assert spec.aa_groups == (spec.groups[0].name,)
    for group in spec.groups:
        closed, opened = group.cells
        assert (closed.name, closed.load, closed.concurrency) == ("c8-p16384", "closed", 8)
        assert (opened.load, opened.rate_from, opened.knee_fraction) == ("open", closed.name, 0.8)
        assert closed.prompt_tokens + closed.output_tokens <= group.max_model_len
