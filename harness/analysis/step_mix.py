"""The model forward per step, split by what each step held: how much of an A/B's forward difference comes
from the arms running different steps, and how much from equal steps taking different time.

The forward runs the same vLLM code on both arms, so a difference in its mean per busy step has two sources:
- **the mix**: the arms ran different steps. A wave's prompts reach the engine a few ms apart, so one arm's
  first step of a wave may hold one prompt where the other's holds three; a prefill chunk costs 30-80x a
  decode step here, so a few such steps move the mean;
- **equal steps**: steps that held the same work took different time (where the KV cache lies in memory,
  the machine's state).

Each busy step is keyed by what it held: (requests, scheduled tokens). For the i-th server lifetime of each
arm (a round of the paired design; the i-th lifetime of ABBA), the keys that both arms ran are weighted by the
smaller of their two counts, and the **equal-step ratio** is the candidate's weighted forward over the
baseline's (means, and medians against outliers). The **mix factor** is what is left of the all-steps ratio:
all-steps ratio = equal-step ratio x mix factor. Intervals: a jackknife over lifetime pairs (leave one pair
out), t with pairs - 1 degrees of freedom, on logs. It also splits the keys into decode-only steps (as many
tokens as requests) and steps that carry a prefill, since the second hold most of the forward's time.

``python -m harness.analysis.step_mix results/serve/<run id>`` prints the split; ``--json PATH`` writes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.analysis.compare import host_steps
from harness.analysis.runs import load_runs, ok_runs
from harness.analysis.statistics import t_quantile
from harness.config import ARM_NAMES, SavedConfig

__all__ = ["KINDS", "Lifetime", "SplitRow", "StepMix", "from_run_dir", "lifetime", "split", "text"]

KINDS = ("all", "decode", "prefill")  # every busy step; decode-only steps; steps that carry a prefill
# harness.analysis.compare.host_steps: the model forward's wall time (the step rows' model_forward);
# "forward" is the whole of execute_model less input preparation
PART = "model_forward"


@dataclass(frozen=True)
class Lifetime:
    """One server lifetime's busy steps: what each held and its forward in us."""

    num_reqs: np.ndarray
    num_tokens: np.ndarray
    forward_us: np.ndarray

    def mask(self, kind: str) -> np.ndarray:
        """The steps of ``kind``."""
        decode = self.num_tokens == self.num_reqs
        return {"all": np.ones_like(decode), "decode": decode, "prefill": ~decode}[kind]

    def by_key(self, kind: str) -> dict[tuple[int, int], np.ndarray]:
        """Forward times per (requests, tokens) key, over the steps of ``kind``."""
        keep = self.mask(kind)
        out: dict[tuple[int, int], list[float]] = {}
        for r, t, f in zip(self.num_reqs[keep], self.num_tokens[keep], self.forward_us[keep], strict=True):
            out.setdefault((int(r), int(t)), []).append(float(f))
        return {k: np.asarray(v) for k, v in out.items()}


def lifetime(steps: Mapping[str, np.ndarray], part: str = PART) -> Lifetime | None:
    """A lifetime from :func:`harness.analysis.compare.host_steps`'s arrays; None without ``part`` timed."""
    if part not in steps or "num_tokens" not in steps:
        return None
    return Lifetime(np.asarray(steps["num_reqs"], dtype=int), np.asarray(steps["num_tokens"], dtype=int),
                    np.asarray(steps[part], dtype=float))  # fmt: skip


@dataclass(frozen=True)
class SplitRow:
    """One kind of step: each arm's steps and mean forward, and the ratios (candidate / baseline)."""

    kind: str
    steps_baseline: int
    steps_candidate: int
    forward_us_baseline: float  # mean per step of the kind, over every lifetime
    forward_us_candidate: float
    share_of_forward_baseline: float  # this kind's part of the baseline's forward time, over all busy steps
    all_steps: float  # mean forward per step of the kind, ratio
    equal_steps: float  # at equal keys, means
    equal_steps_low: float | None
    equal_steps_high: float | None
    equal_steps_median: float  # at equal keys, medians (robust to a lifetime's slow first steps)
    mix: float  # all_steps / equal_steps
    matched_share: float  # share of the baseline's steps of the kind whose key the candidate also ran


@dataclass(frozen=True)
class StepMix:
    run_id: str
    backends: tuple[str, str]
    part: str  # which of host_steps' arrays: model_forward, or forward (execute_model less preparation)
    pairs: int  # lifetime pairs
    rows: tuple[SplitRow, ...]

    def row(self, kind: str) -> SplitRow:
        return next(r for r in self.rows if r.kind == kind)


# Per lifetime pair: the weighted forward of each arm over the keys both ran (weights the smaller count),
# and the baseline's matched and total steps.
Sums = tuple[float, float, int, int]


def _sums(base: Lifetime, cand: Lifetime, kind: str, stat: str) -> Sums:
    fn = np.mean if stat == "mean" else np.median
    a, b = base.by_key(kind), cand.by_key(kind)
    sa = sb = 0.0
    matched = 0
    for key in a.keys() & b.keys():
        w = min(len(a[key]), len(b[key]))
        sa += w * float(fn(a[key]))
        sb += w * float(fn(b[key]))
        matched += len(a[key])
    return sa, sb, matched, sum(len(v) for v in a.values())


def _ratio(sums: Sequence[Sums]) -> float:
    num, den = sum(s[1] for s in sums), sum(s[0] for s in sums)
    return num / den if den > 0 else float("nan")


def _jackknife(sums: Sequence[Sums], alpha: float) -> tuple[float, float] | None:
    """The equal-step ratio's interval: leave one lifetime pair out, on logs."""
    n = len(sums)
    if n < 3:
        return None
    full = np.log(_ratio(sums))
    loo = np.log([_ratio([p for j, p in enumerate(sums) if j != i]) for i in range(n)])
    if not np.all(np.isfinite(loo)):
        return None
    se = float(np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2)))
    half = t_quantile(1 - alpha / 2, n - 1) * se
    return float(np.exp(full - half)), float(np.exp(full + half))


def _steps_of(lives: Sequence[Lifetime], kind: str) -> np.ndarray:
    return np.concatenate([x.forward_us[x.mask(kind)] for x in lives])


def split(pairs: Sequence[tuple[Lifetime, Lifetime]], run_id: str = "", backends: Sequence[str] = ("", ""),
          alpha: float = 0.05, part: str = PART) -> StepMix:  # fmt: skip
    """The forward split over lifetime pairs (baseline, candidate)."""
    if not pairs:
        raise ValueError("step mix: no lifetime pair with the forward timed on both arms")
    base_all = _steps_of([a for a, _ in pairs], "all").sum()
    rows = []
    for kind in KINDS:
        fa, fb = _steps_of([a for a, _ in pairs], kind), _steps_of([b for _, b in pairs], kind)
        if not fa.size or not fb.size:
            continue
        sums = [_sums(a, b, kind, "mean") for a, b in pairs]
        equal = _ratio(sums)
        all_steps = float(fb.mean() / fa.mean())
        ci = _jackknife(sums, alpha)
        rows.append(SplitRow(
            kind=kind, steps_baseline=int(fa.size), steps_candidate=int(fb.size),
            forward_us_baseline=float(fa.mean()), forward_us_candidate=float(fb.mean()),
            share_of_forward_baseline=float(fa.sum() / base_all) if base_all > 0 else float("nan"),
            all_steps=all_steps, equal_steps=equal,
            equal_steps_low=ci[0] if ci else None, equal_steps_high=ci[1] if ci else None,
            equal_steps_median=_ratio([_sums(a, b, kind, "median") for a, b in pairs]), mix=all_steps / equal,
            matched_share=sum(s[2] for s in sums) / max(1, sum(s[3] for s in sums)),
        ))  # fmt: skip
    return StepMix(run_id=run_id, backends=(str(backends[0]), str(backends[1])), part=part, pairs=len(pairs),
                   rows=tuple(rows))  # fmt: skip


def from_run_dir(root: str | Path, part: str = PART) -> StepMix:
    """The split of a serve run directory: the i-th ok lifetime of each arm paired."""
    root = Path(root)
    cfg = SavedConfig.load(root)
    runs = load_runs(root)
    lives: list[list[Lifetime]] = []
    for arm in ARM_NAMES:
        arm_lives = []
        for r in ok_runs(runs, arm, cfg.backends):
            steps = host_steps(r)
            if steps is not None and (life := lifetime(steps, part)) is not None:
                arm_lives.append(life)
        lives.append(arm_lives)
    return split(list(zip(lives[0], lives[1], strict=False)), root.name, cfg.backends, cfg.run.alpha, part)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


def text(res: StepMix) -> list[str]:
    """The split as a markdown table."""
    lines = [
        f"{res.part} per busy step, {res.run_id} ({res.backends[1]} / {res.backends[0]}, {res.pairs} "
        "lifetime pairs): all steps, at equal (requests, tokens) keys, and the mix factor left over",
        "",
        "| steps | steps (baseline / candidate) | share of baseline's time | us per step (baseline / cand.) "
        "| all steps | equal steps [95% CI] | equal steps, medians | mix | baseline steps matched |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res.rows:
        lines.append(
            f"| {r.kind} | {r.steps_baseline} / {r.steps_candidate} | {r.share_of_forward_baseline:.0%} | "
            f"{r.forward_us_baseline:,.0f} / {r.forward_us_candidate:,.0f} | {_f(r.all_steps)} | "
            f"{_f(r.equal_steps)} [{_f(r.equal_steps_low)}, {_f(r.equal_steps_high)}] | "
            f"{_f(r.equal_steps_median)} | {_f(r.mix)} | {r.matched_share:.0%} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--part", default=PART, help="model_forward, forward, execute_other...")
    parser.add_argument("--json", type=Path, help="also write the split here")
    args = parser.parse_args(argv)
    try:
        res = from_run_dir(args.run_dir, args.part)
    except (FileNotFoundError, ValueError) as e:
        print(f"step mix: {e}", file=sys.stderr)
        return 2
    print("\n".join(text(res)))
    if args.json:
        args.json.write_text(json.dumps(asdict(res), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
