"""Training comparisons: the same trainer run with the bug on and off, and a conclusion from the numbers.

A pitfall notebook that trains (01, 03, 04, 06, 07, 11, 12, 13) asks one question: does the switch
change what training measures, by more than the run-to-run noise? ``train_variants`` runs one
trainer per variant (a label → config switches) over one or more seeds, from the same checkpoint,
on the same prompts; ``effect`` compares the variants' final values and says whether the gap is
larger than the noise:

* with several seeds the noise is the standard error of the per-seed differences (paired seeds:
  both variants see the same prompts and initial samples);
* with one seed the only noise estimate is the step-to-step spread of the runs' final steps, so
  the sentence says so ("one seed").

The conclusion is chosen by the numbers (``Effect.larger_than_noise``), never typed in a notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def train_variants(kind: str, model: str, variants: dict[str, dict], *, steps: int, seeds=(0,), problems: int = 64,
                   before=None, **common) -> dict[str, list[list[dict]]]:
    """``{label: [history of seed 0, history of seed 1, …]}`` for ``kind`` in ("ppo", "grpo").

    Every run loads ``model`` afresh; ``before(policy)`` (optional) edits it before training (e.g.
    switch dropout on); ``common`` goes to every config, ``variants[label]`` to that variant's.
    """
    from workbench.models import load
    from workbench.tasks import rl_problems

    if kind == "ppo":
        from workbench.trainers.ppo import PPOConfig as Config
        from workbench.trainers.ppo import PPOTrainer as Trainer
    elif kind == "grpo":
        from workbench.trainers.grpo import GRPOConfig as Config
        from workbench.trainers.grpo import GRPOTrainer as Trainer
    else:
        raise ValueError(f"kind={kind!r}: choose 'ppo' or 'grpo'")
    runs: dict[str, list[list[dict]]] = {}
    for label, switches in variants.items():
        runs[label] = []
        for seed in seeds:
            policy, tokenizer = load(model)
            if before is not None:
                before(policy)
            config = Config(steps=steps, seed=seed, progress=False, **{**common, **switches})
            runs[label].append(Trainer(policy, tokenizer, rl_problems(problems), config).train())
    return runs


def first_seed(runs: dict[str, list[list[dict]]]) -> dict[str, list[dict]]:
    """``{label: history}`` of the first seed (what ``plots.plot_curves`` draws)."""
    return {label: histories[0] for label, histories in runs.items()}


def tail_mean(history: list[dict], key: str, fraction: float = 0.25) -> float:
    """Mean of ``key`` over the last ``fraction`` of the steps (at least one), NaNs ignored."""
    values = np.array([h[key] for h in history if key in h], dtype=float)
    tail = values[-max(1, math.ceil(len(values) * fraction)):]
    return float(np.nanmean(tail)) if np.isfinite(tail).any() else float("nan")


@dataclass
class Effect:
    """bug − fix of one metric over the final steps, against the noise."""

    key: str
    bug: float
    fix: float
    difference: float
    noise: float
    seeds: int
    larger_than_noise: bool

    def sentence(self, unit: str = "") -> str:
        unit = f" {unit}" if unit else ""
        source = f"over {self.seeds} seeds" if self.seeds > 1 else "one seed, step-to-step noise"
        verdict = "larger than" if self.larger_than_noise else "not larger than"
        return (f"{self.key}: bug {self.bug:.3g}, fix {self.fix:.3g}{unit}; effect {self.difference:+.3g} ± {self.noise:.2g} "
                f"({source}): {verdict} the noise")


def effect(runs: dict[str, list[list[dict]]], key: str, bug: str, fix: str, *, fraction: float = 0.25,
           factor: float = 2.0) -> Effect:
    """Compare ``runs[bug]`` with ``runs[fix]`` on the tail mean of ``key``.

    The effect counts as real when |difference| > ``factor`` × noise (≈ a 95 % interval): the
    standard error of the paired per-seed differences with ≥ 2 seeds; with one seed the standard
    error of the tail steps' differences (steps are correlated, so this is optimistic, and the
    sentence names it).
    """
    bug_runs, fix_runs = runs[bug], runs[fix]
    n = min(len(bug_runs), len(fix_runs))
    bug_tails = np.array([tail_mean(h, key, fraction) for h in bug_runs[:n]])
    fix_tails = np.array([tail_mean(h, key, fraction) for h in fix_runs[:n]])
    differences = bug_tails - fix_tails
    if n > 1:
        noise = float(np.std(differences, ddof=1) / math.sqrt(n))
    else:
        def tail(history):
            values = np.array([h[key] for h in history if key in h], dtype=float)
            return values[-max(2, math.ceil(len(values) * fraction)):]
        a, b = tail(bug_runs[0]), tail(fix_runs[0])
        m = min(len(a), len(b))
        step_differences = a[-m:] - b[-m:]
        noise = float(np.nanstd(step_differences, ddof=1) / math.sqrt(m)) if m > 1 else float("nan")
    difference = float(np.mean(differences))
    larger = bool(np.isfinite(noise) and abs(difference) > factor * noise)
    return Effect(key=key, bug=float(np.mean(bug_tails)), fix=float(np.mean(fix_tails)), difference=difference,
                  noise=noise, seeds=n, larger_than_noise=larger)


def first_divergence(a: list[dict], b: list[dict], key: str, tolerance: float = 1e-9) -> int | None:
    """The first step at which two runs' ``key`` differ by more than ``tolerance`` (None: never)."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if abs(x[key] - y[key]) > tolerance:
            return step
    return None
