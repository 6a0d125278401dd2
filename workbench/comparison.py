"""Training comparisons: the same trainer run with the bug on and off, and a conclusion from the numbers.

A pitfall notebook that trains (01, 03, 04, 06, 07, 11, 12, 13) asks one question: does the switch
change what training measures, by more than the run-to-run noise? ``train_variants`` runs one
trainer per variant (a label → config switches) over one or more seeds, from the same checkpoint,
on the same prompts; ``effect`` compares the variants' final values and says whether the gap is
larger than the noise:

* with several seeds the noise is the standard error of the per-seed differences (paired seeds:
  both variants see the same prompts and initial samples);
* with one seed the only noise estimate is the step-to-step spread of the two runs' difference over
  the final steps (a conservative stand-in), and the sentence says so ("one seed").

The conclusion is chosen by the numbers (``Effect.larger_than_noise``), never typed in a notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def train_variants(kind: str, model: str, variants: dict[str, dict], *, steps: int, seeds=(0,), problems: int = 64,
                   before=None, processes: int = 1, device: str = "auto", pad_token: str | None = "auto",
                   **common) -> dict[str, list[list[dict]]]:
    """``{label: [history of seed 0, history of seed 1, …]}`` for ``kind`` in ("ppo", "grpo").

    Every run loads ``model`` afresh; ``before(policy)`` (optional) edits it before training (e.g.
    switch dropout on); ``common`` goes to every config, ``variants[label]`` to that variant's.
    ``processes`` > 1 runs the (variant, seed) pairs in that many worker processes, each with its
    share of the CPU threads (``before`` must then be picklable: a module-level function or a
    ``functools.partial`` of one). Results do not depend on ``processes``. ``device`` and
    ``pad_token`` go to ``workbench.models.load`` (the notebooks' parameters of those names).
    """
    loading = {"device": device, "pad_token": pad_token}
    jobs = [(label, seed) for label in variants for seed in seeds]
    if processes > 1 and len(jobs) > 1:
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, (os.cpu_count() or 1) // processes)
        with ProcessPoolExecutor(max_workers=min(processes, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_train_one, kind, model, {**common, **variants[label]}, steps, seed, problems, before, threads,
                                   loading)
                       for label, seed in jobs]
            histories = [f.result() for f in futures]
    else:
        histories = [_train_one(kind, model, {**common, **variants[label]}, steps, seed, problems, before, None, loading)
                     for label, seed in jobs]
    runs: dict[str, list[list[dict]]] = {label: [] for label in variants}
    for (label, _), history in zip(jobs, histories, strict=True):
        runs[label].append(history)
    return runs


def _train_one(kind: str, model: str, switches: dict, steps: int, seed: int, problems: int, before=None,
               threads: int | None = None, loading: dict | None = None) -> list[dict]:
    import torch

    from workbench.models import load
    from workbench.tasks import rl_problems

    if threads is not None:
        torch.set_num_threads(threads)
    if kind == "ppo":
        from workbench.trainers.ppo import PPOConfig as Config
        from workbench.trainers.ppo import PPOTrainer as Trainer
    elif kind == "grpo":
        from workbench.trainers.grpo import GRPOConfig as Config
        from workbench.trainers.grpo import GRPOTrainer as Trainer
    else:
        raise ValueError(f"kind={kind!r}: choose 'ppo' or 'grpo'")
    policy, tokenizer = load(model, **(loading or {}))
    if before is not None:
        before(policy)
    config = Config(steps=steps, seed=seed, progress=False, **switches)
    return Trainer(policy, tokenizer, rl_problems(problems), config).train()


def plot_bands(ax, runs: dict[str, list[list[dict]]], key: str, ylabel: str, colors: dict | None = None, *, window: int = 1) -> None:
    """Mean over seeds per variant (a line, aligned moving average when ``window`` > 1) with a ± std band;
    one seed draws the line alone."""
    from workbench import plots

    for i, (label, histories) in enumerate(runs.items()):
        values = np.array([[h[key] for h in run] for run in histories], dtype=float)
        x, mean = plots.smooth(np.nanmean(values, axis=0), window)
        color = (colors or {}).get(label)
        line, = ax.plot(x, mean, ls=plots.LINE_STYLES[i % 4], marker=plots.MARKERS[i % 6], markevery=max(1, len(x) // 8),
                        markersize=4, color=color, zorder=10 - i, label=f"{label} (n={len(histories)})")
        if len(histories) > 1:
            _, std = plots.smooth(np.nanstd(values, axis=0, ddof=1), window)
            ax.fill_between(x, np.array(mean) - std, np.array(mean) + std, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel + (" (mean ± std over seeds)" if max(len(h) for h in runs.values()) > 1 else ""))
    ax.legend(fontsize=8)


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
    standard error of the paired per-seed differences with ≥ 2 seeds; with one seed the spread
    (standard deviation, not its standard error: steps are correlated and seeds are not sampled)
    of the per-step differences over the tail, and the sentence names it.
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
        noise = float(np.nanstd(step_differences, ddof=1)) if m > 1 else float("nan")
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
