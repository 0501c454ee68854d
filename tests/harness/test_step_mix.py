"""The forward's split into step mix and equal steps (harness.analysis.step_mix) on synthetic lifetimes whose
costs per (requests, tokens) key are known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.analysis import step_mix
from harness.analysis.step_mix import Lifetime, split

DECODE_US = 1_400.0
CHUNK_US_PER_TOKEN = 37.0  # a prefill-bearing step's cost per scheduled token


def _life(keys: list[tuple[int, int, int]], scale: float = 1.0, rng: np.random.Generator | None = None,
          noise: float = 0.0) -> Lifetime:  # fmt: skip
    """A lifetime of (requests, tokens, count) steps: decode-only steps cost DECODE_US, the others
    CHUNK_US_PER_TOKEN per token; every cost times ``scale`` and, with ``rng``, log-normal noise."""
    reqs, toks, us = [], [], []
    for r, t, n in keys:
        for _ in range(n):
            cost = DECODE_US if r == t else CHUNK_US_PER_TOKEN * t
            reqs.append(r)
            toks.append(t)
            us.append(cost * scale * (float(np.exp(rng.normal(0, noise))) if rng is not None else 1.0))
    return Lifetime(np.asarray(reqs), np.asarray(toks), np.asarray(us))


# One wave of 8 prompts of 1,024 tokens in chunks of 2,048, then 63 decode steps: two ways of chunking it.
EARLY = [(3, 2048, 1), (5, 2048, 2), (8, 1031, 1), (8, 8, 63)]
LATE = [(1, 1024, 1), (3, 2048, 1), (5, 2048, 1), (7, 2048, 1), (8, 1031, 1), (8, 8, 63)]


def test_equal_steps_at_equal_cost_leave_the_whole_difference_to_the_mix() -> None:
    pairs = [(_life(LATE), _life(EARLY))] * 4
    res = split(pairs)
    everything = res.row("all")
    assert everything.equal_steps == pytest.approx(1.0)
    assert everything.equal_steps_median == pytest.approx(1.0)
    assert everything.all_steps != pytest.approx(1.0)
    assert everything.mix == pytest.approx(everything.all_steps)
    assert res.row("decode").all_steps == pytest.approx(1.0)
    # the baseline's (1, 1024) and (7, 2048) steps have no twin; its (5, 2048) step has one, counted once
    assert everything.matched_share == pytest.approx(1 - 2 / 68)


def _slower(rng: np.random.Generator, level_sd: float) -> list[tuple[Lifetime, Lifetime]]:
    """6 lifetime pairs, the candidate's every step 10% slower, each lifetime at its own level."""
    def level() -> float:
        return float(np.exp(rng.normal(0, level_sd)))
    return [(_life(EARLY, level(), rng, 0.03), _life(EARLY, 1.10 * level(), rng, 0.03)) for _ in range(6)]


@pytest.mark.parametrize("level_sd", [0.0, 0.05])
def test_the_equal_step_interval_covers_the_true_ratio(level_sd: float) -> None:
    rng = np.random.default_rng(0)
    rows = [split(_slower(rng, level_sd)).row("all") for _ in range(200)]
    covered = sum(r.equal_steps_low < 1.10 < r.equal_steps_high for r in rows) / len(rows)
    assert 0.90 <= covered <= 0.99


def test_every_step_slower_shows_in_equal_steps_and_not_in_the_mix() -> None:
    res = split(_slower(np.random.default_rng(3), 0.0), run_id="r", backends=("paged", "tagma"))
    for kind in ("all", "decode", "prefill"):
        row = res.row(kind)
        assert row.equal_steps == pytest.approx(1.10, rel=0.03)
        assert row.mix == pytest.approx(1.0, abs=0.02)
    shares = res.row("decode").share_of_forward_baseline + res.row("prefill").share_of_forward_baseline
    assert shares == pytest.approx(1.0)
    assert res.row("prefill").share_of_forward_baseline > 0.5  # a few chunks outweigh 63 decode steps
    assert "| prefill | 24 / 24 | 75% |" in "\n".join(step_mix.text(res))


def test_an_interval_needs_three_pairs_and_a_split_needs_one() -> None:
    res = split([(_life(EARLY), _life(EARLY, 0.9))] * 2)
    assert res.row("all").equal_steps == pytest.approx(0.9)
    assert res.row("all").equal_steps_low is None
    with pytest.raises(ValueError, match="no lifetime pair"):
        split([])


def test_a_lifetime_needs_the_timed_part_and_the_tokens() -> None:
    steps = {"num_reqs": np.array([1.0, 8.0]), "num_tokens": np.array([1024.0, 8.0]),
             "model_forward": np.array([37_000.0, 1_400.0])}  # fmt: skip
    life = step_mix.lifetime(steps)
    assert life is not None and life.by_key("decode") == {(8, 8): pytest.approx(np.array([1_400.0]))}
    assert step_mix.lifetime({k: v for k, v in steps.items() if k != "num_tokens"}) is None
    assert step_mix.lifetime(steps, part="forward") is None


def test_the_command_says_why_a_directory_gives_no_split(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert step_mix.main([str(tmp_path)]) == 2
    assert "step mix:" in capsys.readouterr().err
