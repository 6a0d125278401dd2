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

Training runs only tell something when the policy *learns*: ``learning_settings(kind)`` holds, in
one place, the settings measured to raise held-out greedy accuracy of the shipped tiny policy
(docs/LEARNING.md), and ``train_variants(..., problems=None, held_out=N)`` trains on every training
prompt and scores N fixed held-out prompts greedily before and after each run (``heldout_accuracy``
in the run's last record); ``gain`` says whether a variant's held-out accuracy rose by more than the
seed noise.

The conclusion is chosen by the numbers (``Effect.larger_than_noise``), never typed in a notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Settings measured to raise held-out greedy accuracy of tiny-arith-qwen2 (docs/LEARNING.md, 3 seeds each).
# "full": scripts/learning_settings.py's reference runs; "notebook": the cheaper variant the training
# notebooks use to stay within the catalogue's time budget (measured to still learn, numbers in the doc).
LEARNING_SETTINGS = {
    ("grpo", "full"): dict(learning_rate=1e-5, prompts_per_step=32, num_generations=8, steps=60, max_new_tokens=6,
                           loss_agg="seq-mean-token-mean"),
    ("ppo", "full"): dict(learning_rate=1e-5, prompts_per_step=64, steps=60, max_new_tokens=6),
    ("grpo", "notebook"): dict(learning_rate=2e-5, prompts_per_step=32, num_generations=8, steps=30, max_new_tokens=6,
                               loss_agg="seq-mean-token-mean"),
    ("ppo", "notebook"): dict(learning_rate=1.5e-5, prompts_per_step=48, steps=40, max_new_tokens=6),
}
HELD_OUT = 400  # held-out test prompts scored greedily before and after a run (docs/LEARNING.md)


# Two-sided 95 % critical values of Student's t by degrees of freedom (n seeds → n − 1): with 3 seeds an
# effect needs |mean difference| > 4.30 standard errors, not 2. Between listed values the smaller dof's
# (larger, conservative) value is used; beyond 30, the normal 1.96.
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


def t_critical(seeds: int) -> float:
    """The 95 % two-sided t critical value for the mean of ``seeds`` paired differences (n − 1 dof)."""
    dof = seeds - 1
    if dof < 1:
        return float("nan")
    if dof > 30:
        return 1.96
    return T_95[max(d for d in T_95 if d <= dof)]


def _threshold(seeds: int, factor: float | None) -> float:
    """How many standard errors an effect must exceed: ``factor`` when given, else the t critical value."""
    return factor if factor is not None else t_critical(seeds)


def learning_settings(kind: str, budget: str = "notebook", **overrides) -> dict:
    """Trainer settings under which ``kind`` ("grpo", "ppo") raises held-out accuracy; ``overrides``
    replace single entries (e.g. ``steps=3`` in smoke mode). Train with ``train_variants(...,
    problems=None, held_out=HELD_OUT, **settings)``: all training prompts, held-out accuracy recorded."""
    if (kind, budget) not in LEARNING_SETTINGS:
        raise ValueError(f"learning_settings({kind!r}, {budget!r}): kind must be 'grpo' or 'ppo' and budget 'full' or 'notebook'")
    return {**LEARNING_SETTINGS[kind, budget], **overrides}


def train_variants(kind: str, model: str, variants: dict[str, dict], *, steps: int, seeds=(0,), problems: int | None = 64,
                   held_out: int = 0, before=None, processes: int = 1, device: str = "auto", pad_token: str | None = "auto",
                   return_models: bool = False, **common):
    """``{label: [history of seed 0, history of seed 1, …]}`` for ``kind`` in ("ppo", "grpo", "dpo").

    Every run loads ``model`` afresh; ``before(policy)`` (optional) edits it before training (e.g.
    switch dropout on); ``common`` goes to every config, ``variants[label]`` to that variant's.
    ``problems``: train on the first that many training prompts (DPO: preference pairs), or on all
    of them (None: the learning settings). ``held_out`` > 0 scores the first ``held_out`` test prompts greedily (eval
    mode) before and after training and adds ``heldout_accuracy_start``, ``heldout_accuracy`` and
    ``heldout_gain`` to the run's last record.
    ``processes`` > 1 runs the (variant, seed) pairs in that many worker processes, each with its
    share of the CPU threads (``before`` must then be picklable: a module-level function or a
    ``functools.partial`` of one). Results do not depend on ``processes``. ``device`` and
    ``pad_token`` go to ``workbench.modeling.models.load`` (the notebooks' parameters of those names).
    ``return_models``: return ``(runs, {label: trained policy of the first seed})`` instead.
    """
    if kind not in TRAINERS:
        raise ValueError(f"kind={kind!r}: choose one of {sorted(TRAINERS)}")
    loading = {"device": device, "pad_token": pad_token}
    jobs = [(label, seed) for label in variants for seed in seeds]
    keep = [return_models and seed == seeds[0] for _, seed in jobs]
    if processes > 1 and len(jobs) > 1:
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, (os.cpu_count() or 1) // processes)
        with ProcessPoolExecutor(max_workers=min(processes, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_train_one, kind, model, {**common, **variants[label]}, steps, seed, problems, before, threads,
                                   loading, held_out, k)
                       for (label, seed), k in zip(jobs, keep, strict=True)]
            results = [f.result() for f in futures]
    else:
        results = [_train_one(kind, model, {**common, **variants[label]}, steps, seed, problems, before, None, loading,
                              held_out, k) for (label, seed), k in zip(jobs, keep, strict=True)]
    runs: dict[str, list[list[dict]]] = {label: [] for label in variants}
    models = {}
    for (label, _), (history, state) in zip(jobs, results, strict=True):
        runs[label].append(history)
        if state is not None:
            from workbench.modeling.models import load

            models[label], _ = load(model, **loading)
            models[label].load_state_dict(state)
    return (runs, models) if return_models else runs


# kind → (module, config class, trainer class) under workbench.trainers
TRAINERS = {"ppo": ("ppo", "PPOConfig", "PPOTrainer"), "grpo": ("grpo", "GRPOConfig", "GRPOTrainer"),
            "dpo": ("dpo", "DPOConfig", "DPOTrainer")}


def _train_one(kind: str, model: str, switches: dict, steps: int, seed: int, problems: int | None, before=None,
               threads: int | None = None, loading: dict | None = None, held_out: int = 0,
               keep_model: bool = False) -> tuple[list[dict], dict | None]:
    """One run: its history, and its trained weights when ``keep_model``. ``threads`` None (a run in
    this process): a tiny model on the CPU runs on one thread, the caller's setting restored after —
    its matrices are too small to gain from two, and two threads on a shared machine wait on each
    other (measured: a 3-step PPO pair 1.5 s on one thread, 17–34 s on two beside another job)."""
    import torch

    previous = torch.get_num_threads()
    try:
        return _train_one_unguarded(kind, model, switches, steps, seed, problems, before, threads, loading, held_out, keep_model)
    finally:
        torch.set_num_threads(previous)


def _train_one_unguarded(kind, model, switches, steps, seed, problems, before, threads, loading, held_out, keep_model):
    import importlib

    import torch

    from workbench import tasks
    from workbench.modeling.models import count_parameters, load
    from workbench.trainers.base import TINY_MODEL_PARAMETERS

    if threads is not None:
        torch.set_num_threads(threads)
    module, config_name, trainer_name = TRAINERS[kind]
    trainers = importlib.import_module(f"workbench.trainers.{module}")
    Config, Trainer = getattr(trainers, config_name), getattr(trainers, trainer_name)
    policy, tokenizer = load(model, **(loading or {}))
    if threads is None and next(policy.parameters()).device.type == "cpu" and count_parameters(policy) < TINY_MODEL_PARAMETERS:
        torch.set_num_threads(1)
    if before is not None:
        before(policy)
    config = Config(steps=steps, seed=seed, progress=False, **switches)
    torch.manual_seed(seed)  # the global generator draws dropout masks (P7's bug variant): same seed, same run
    test = tasks.load_problems(tasks.TEST_PROMPTS)[:held_out] if held_out > 0 else []
    start = _held_out_accuracy(policy, tokenizer, test) if test else None
    if kind == "dpo" and test:
        pairs = tasks.load_preferences(tasks.TEST_PREFERENCES)[:held_out]
        held_out_pairs = _held_out_pair_logps(policy, tokenizer, pairs)
    if kind == "dpo":
        train = tasks.load_preferences(tasks.TRAIN_PREFERENCES)[:problems]
    else:
        train = tasks.load_problems(tasks.TRAIN_PROMPTS) if problems is None else tasks.rl_problems(problems)
    history = Trainer(policy, tokenizer, train, config).train()
    if test and history:
        end = _held_out_accuracy(policy, tokenizer, test)
        history[-1].update(heldout_accuracy_start=start, heldout_accuracy=end, heldout_gain=end - start)
        if kind == "dpo":  # what DPO does to the answers it is shown, on pairs it never saw
            history[-1].update({f"{k}_start": v for k, v in held_out_pairs.items()})
            history[-1].update(_held_out_pair_logps(policy, tokenizer, pairs))
    return history, ({k: v.detach().cpu() for k, v in policy.state_dict().items()} if keep_model else None)


def _held_out_pair_logps(policy, tokenizer, pairs, chunk: int = 200) -> dict[str, float]:
    """Mean summed log-prob of the chosen and of the rejected responses (prompt excluded), eval mode."""
    import torch

    from workbench.trainers.preferences import build_loss_mask, collate_preferences, summed_logprobs

    training = policy.training
    policy.eval()
    chosen, rejected = [], []
    try:
        with torch.no_grad():
            for i in range(0, len(pairs), chunk):
                batch = collate_preferences(tokenizer, pairs[i:i + chunk]).to(next(policy.parameters()).device)
                summed, _ = summed_logprobs(policy, batch, build_loss_mask(batch.attention_mask, batch.prompt_lengths, "both"))
                chosen += summed[:batch.num_pairs].tolist()
                rejected += summed[batch.num_pairs:].tolist()
    finally:
        policy.train(training)
    return {"heldout_logp_chosen": float(np.mean(chosen)), "heldout_logp_rejected": float(np.mean(rejected))}


def _held_out_accuracy(policy, tokenizer, problems) -> float:
    """Greedy accuracy in eval mode (no dropout), the policy's mode restored afterwards."""
    from workbench.experiments.evaluation import greedy_accuracy

    training = policy.training
    policy.eval()
    try:
        return greedy_accuracy(policy, tokenizer, problems)
    finally:
        policy.train(training)


def plot_bands(ax, runs: dict[str, list[list[dict]]], key: str, ylabel: str, colors: dict | None = None, *,
               window: int = 1, styles: dict | None = None, log: bool = False) -> None:
    """Mean over seeds per variant (a line, aligned moving average when ``window`` > 1, said in the
    y-label) with a ± std band; one seed draws the line alone. ``styles[label]`` replaces the line
    style and marker chosen by order.

    ``log``: a log y-axis, where a ± std band would dip below 0 and draw false stripes and exact zeros
    would vanish: the band is then the min–max over seeds, values ≤ 0 are drawn at a floor a decade
    below the smallest positive value, and a variant that is exactly 0 throughout says so on the axes."""
    from workbench.viz import plots

    series = {label: np.array([[h[key] for h in run] for run in histories], dtype=float) for label, histories in runs.items()}
    positive = np.concatenate([v[v > 0] for v in series.values()] + [np.array([])])
    floor = float(positive.min()) / 10 if log and positive.size else 1e-12
    zero_labels = []
    for i, (label, values) in enumerate(series.items()):
        x, mean = plots.smooth(np.nanmean(values, axis=0), window)
        mean = np.asarray(mean, dtype=float)
        color = (colors or {}).get(label)
        style = (styles or {}).get(label, {"ls": plots.LINE_STYLES[i % 4], "marker": plots.MARKERS[i % 6]})
        if log and np.all(values[np.isfinite(values)] <= 0):
            zero_labels.append(label)
        line, = ax.plot(x, np.maximum(mean, floor) if log else mean, markevery=max(1, len(x) // 8), markersize=4, color=color,
                        zorder=10 - i, label=f"{label} (n={len(values)})", **style)
        if len(values) > 1:
            if log:
                low, high = (np.asarray(plots.smooth(f(values, axis=0), window)[1], dtype=float) for f in (np.nanmin, np.nanmax))
                low, high = np.maximum(low, floor), np.maximum(high, floor)
            else:
                std = np.asarray(plots.smooth(np.nanstd(values, axis=0, ddof=1), window)[1], dtype=float)
                low, high = mean - std, mean + std
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("training step")
    notes = []
    if max(len(v) for v in series.values()) > 1:
        notes.append("mean; band: min–max over seeds" if log else "mean ± std over seeds")
    if window > 1:
        notes.append(f"{window}-step moving average")
    ax.set_ylabel(ylabel + (f" ({', '.join(notes)})" if notes else ""))
    if log:
        ax.set_yscale("log")
        for k, label in enumerate(zero_labels):
            ax.text(0.02, 0.04 + 0.08 * k, f"{label}: exactly 0 at every step (drawn at {floor:.0e})", transform=ax.transAxes,
                    fontsize=7, color=(colors or {}).get(label, plots.NEUTRAL_COLOR))
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
    """bug − fix of one metric over the final steps (or at the first step), against the noise."""

    key: str
    bug: float
    fix: float
    difference: float
    noise: float
    seeds: int
    larger_than_noise: bool
    names: tuple[str, str] = ("bug", "fix")
    threshold: float = float("nan")  # how many ``noise`` units the effect had to exceed

    def sentence(self, unit: str = "") -> str:
        unit = f" {unit}" if unit else ""
        if self.seeds > 1:
            source = f"s.e. over {self.seeds} seeds; 95 % needs |effect| > {self.threshold:.2f} s.e. = {self.threshold * self.noise:.2g}"
        else:
            source = (f"one seed, step-to-step std; needs > {self.threshold:.0f} std" if math.isfinite(self.noise)
                      else "one seed: no noise estimate")
        verdict = "larger than" if self.larger_than_noise else "not larger than"
        verdict += " seed noise" if self.seeds > 1 else " the noise"
        a, b = self.names
        return (f"{self.key}: {a} {self.bug:.3g}, {b} {self.fix:.3g}{unit}; effect {self.difference:+.3g} ± {self.noise:.2g} "
                f"({source}): {verdict}")


def _paired(key: str, a, b, names: tuple[str, str], threshold: float, noise: float | None = None) -> Effect:
    """a − b per seed (paired: same seed, same prompts), its mean against ``noise`` — by default the
    standard error over seeds (one seed: none) — and counted as real beyond ``threshold`` × noise."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    if noise is None:
        noise = float(np.std(a - b, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    difference = float(np.mean(a - b))
    return Effect(key=key, bug=float(np.mean(a)), fix=float(np.mean(b)), difference=difference, noise=noise, seeds=n,
                  larger_than_noise=bool(np.isfinite(noise) and abs(difference) > threshold * noise), threshold=threshold, names=names)


def effect(runs: dict[str, list[list[dict]]], key: str, bug: str, fix: str, *, fraction: float = 0.25,
           factor: float | None = None, at: str = "end") -> Effect:
    """Compare ``runs[bug]`` with ``runs[fix]`` on the tail mean of ``key`` (``at="start"``: on the
    first step's value, e.g. a gap that exists before any update and is therefore not learnt).

    The effect counts as real when |difference| > threshold × noise: with ≥ 2 seeds the noise is the
    standard error of the paired per-seed differences and the threshold the 95 % Student-t value for
    n − 1 degrees of freedom (4.30 for 3 seeds; ``factor`` overrides it); with one seed the noise is the
    spread (standard deviation, not its standard error: steps are correlated and seeds are not
    sampled) of the per-step differences over the tail, the threshold 2 (or ``factor``), and the
    sentence names it.
    """
    if at not in ("end", "start"):
        raise ValueError(f"at={at!r}: choose 'end' (tail mean) or 'start' (first step)")
    bug_runs, fix_runs = runs[bug], runs[fix]
    n = min(len(bug_runs), len(fix_runs))

    def value(history):
        return float(history[0][key]) if at == "start" else tail_mean(history, key, fraction)

    noise = None  # several seeds: the standard error of the paired differences
    if n == 1 and at == "start":
        noise = float("nan")  # one value per run: no noise estimate
    elif n == 1:
        def tail(history):
            values = np.array([h[key] for h in history if key in h], dtype=float)
            return values[-max(2, math.ceil(len(values) * fraction)):]
        a, b = tail(bug_runs[0]), tail(fix_runs[0])
        m = min(len(a), len(b))
        noise = float(np.nanstd(a[-m:] - b[-m:], ddof=1)) if m > 1 else float("nan")
    threshold = _threshold(n, factor) if n > 1 else (factor if factor is not None else 2.0)
    return _paired(key + (" at step 0" if at == "start" else ""), [value(h) for h in bug_runs[:n]],
                   [value(h) for h in fix_runs[:n]], (bug, fix), threshold, noise)


def gain(runs: dict[str, list[list[dict]]], label: str, key: str = "heldout_accuracy", *, factor: float | None = None) -> Effect:
    """Did ``label``'s runs learn? Held-out greedy accuracy after − before (``train_variants(...,
    held_out=N)``; another held-out ``key`` recorded with ``{key}_start``, e.g. DPO's
    ``heldout_logp_chosen``), against the standard error over seeds (one seed: no noise estimate,
    never "larger"). The ``Effect`` reads end (``bug``) vs start (``fix``)."""
    records = [history[-1] for history in runs[label]]
    if not records or any(key not in r or f"{key}_start" not in r for r in records):
        raise ValueError(f"gain({label!r}, {key!r}): the runs carry no held-out {key}; "
                         "train with train_variants(..., held_out=N)")
    name = "held-out greedy accuracy" if key == "heldout_accuracy" else key
    return _paired(f"{name}, {label}", [r[key] for r in records], [r[f"{key}_start"] for r in records], ("end", "start"),
                   _threshold(len(records), factor))


def learnt_gap(runs: dict[str, list[list[dict]]], key: str, bug: str, fix: str, *, fraction: float = 0.25,
               factor: float | None = None) -> Effect:
    """The part of the bug − fix gap in ``key`` that training added: per seed, the gap over the final
    steps minus the gap at step 0 (e.g. P7: sampling with dropout on lowers the reward before any
    update), against the standard error over seeds. Reads final gap vs step-0 gap."""
    pairs = list(zip(runs[bug], runs[fix], strict=False))
    start = [float(b[0][key]) - float(f[0][key]) for b, f in pairs]
    end = [tail_mean(b, key, fraction) - tail_mean(f, key, fraction) for b, f in pairs]
    return _paired(f"{key} gap learnt (final gap − step-0 gap)", end, start, ("final gap", "step-0 gap"),
                   _threshold(len(pairs), factor))


def drift(runs: dict[str, list[list[dict]]], label: str, key: str, *, fraction: float = 0.25, factor: float | None = None) -> Effect:
    """How far ``key`` moved during ``label``'s runs: tail mean − first step per seed, against the
    standard error over seeds (one seed: no noise estimate, never "larger"). Reads end vs start."""
    histories = runs[label]
    return _paired(f"{key}, {label}", [tail_mean(h, key, fraction) for h in histories], [float(h[0][key]) for h in histories],
                   ("end", "start"), _threshold(len(histories), factor))


def learning_sentence(runs: dict[str, list[list[dict]]]) -> str:
    """One line per variant: does its held-out greedy accuracy rise by more than the seed noise?"""
    return "\n".join(gain(runs, label).sentence() for label in runs)


def plot_heldout(ax, runs: dict[str, list[list[dict]]], colors: dict | None = None) -> None:
    """Held-out greedy accuracy before and after training per variant: one dot per seed, mean ± std bar."""
    for i, (label, histories) in enumerate(runs.items()):
        start = np.array([h[-1]["heldout_accuracy_start"] for h in histories], dtype=float)
        end = np.array([h[-1]["heldout_accuracy"] for h in histories], dtype=float)
        color = (colors or {}).get(label)
        for j, (values, x) in enumerate(((start, i - 0.15), (end, i + 0.15))):
            std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            ax.errorbar([x], [values.mean()], yerr=[std], fmt="o" if j else "s", mfc="none" if j == 0 else color,
                        color=color or "0.3", capsize=4, zorder=3)
            ax.scatter(np.full(len(values), x + 0.06), values, s=10, color=color or "0.3", alpha=0.6, zorder=2)
    ax.set_xticks(range(len(runs)), [f"{label}\n(start □ → end ●)" for label in runs], fontsize=8)
    ax.set_ylabel("held-out greedy accuracy" + (" (mean ± std, dots: seeds)" if max(len(h) for h in runs.values()) > 1 else ""))


def first_divergence(a: list[dict], b: list[dict], key: str, tolerance: float = 1e-9) -> int | None:
    """The first step at which two runs' ``key`` differ by more than ``tolerance`` (None: never)."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if abs(x[key] - y[key]) > tolerance:
            return step
    return None
