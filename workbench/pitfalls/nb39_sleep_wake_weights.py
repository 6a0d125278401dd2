"""Pitfall P39: sampler weights dropped on sleep and replaced on wake by the checkpoint on disk, not the trainer's.

A colocated rollout engine sleeps while the trainer runs, to give the GPU back: vLLM's ``sleep(level=1)`` offloads
the weights to CPU memory (``wake_up`` copies them back), ``sleep(level=2)`` discards them (``wake_up`` re-allocates the
memory, its contents undefined: vLLM #29341's gibberish, #21336). After a level-2 wake someone must write weights.
TRL's GRPO with ``vllm_enable_sleep_mode=True`` slept at level 2 (TRL PR #4296) and, to avoid the gibberish, called
``collective_rpc("reload_weights")`` at every wake in ``generate()`` (TRL PR #4571) — which reads the *checkpoint on
disk* and overwrote the trainer's weights that ``sync_weights()`` had just pushed. The rollout sampled from the initial
policy at every step: TRL issue #5312 measured ``sampling/sampling_logp_difference/mean`` rising from 0.015 to 0.201
nats over training; the fix (TRL PR #5313, 2026) tracks whether the weights are asleep (``_llm_weights_sleeping``) and
restores them from the trainer's sync, never from disk, so ``generate()`` samples what was pushed.

``Engine`` models the engine's weight life cycle on the sampler copy (``sleep(level)``, ``wake_up()``,
``reload_weights()`` from the checkpoint on disk, ``load_weights()`` from the trainer), and each step's source of
weights is recorded. The vLLM CPU build cannot run this side by side: its platform reports no sleep mode
(``is_sleep_mode_available()`` is true for CUDA, ROCm and XPU only; ``enable_sleep_mode=True`` raises "Sleep mode is
not supported on current platform"), its CPU worker's ``sleep``/``wake_up`` only log "sleep mode is not supported on
CPU, ignore it", and level-2 discard needs the CUDA virtual-memory allocator (``cumem``) to free and re-map memory.
"""

from __future__ import annotations

import copy

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from workbench.core import progress
from workbench.experiments import statistics
from workbench.experiments import weight_sync as ws
from workbench.viz import plots
from workbench.viz.explorer import Explorer

WAKES = ("disk_reload", "trainer_reload")  # the bug (TRL after PR #4571), the fix (TRL PR #5313)
ENGINE_CPU_NOTE = ("vLLM's CPU build has no sleep mode: Platform.is_sleep_mode_available() is true for CUDA, ROCm and XPU "
                   "only, so enable_sleep_mode=True raises 'Sleep mode is not supported on current platform', and the CPU "
                   "worker's sleep()/wake_up() log 'sleep mode is not supported on CPU, ignore it'; level-2 discard needs "
                   "the CUDA virtual-memory allocator (cumem) to release and re-map the weights' memory")


# ---- measurements --------------------------------------------------------------------------------
class Engine:
    """The sampler copy with an engine's weight life cycle. ``sleep(1)`` keeps a CPU copy of the weights, ``sleep(2)``
    discards them (here: zeroed, a deterministic stand-in for memory whose contents are undefined; buffers such as the
    rotary tables are kept, as vLLM backs them up); ``wake_up()`` restores a level-1 copy and leaves level-2 weights
    undefined; ``reload_weights()`` reads the checkpoint on disk; ``load_weights(state)`` writes the trainer's.
    ``source`` says where the current weights came from: ``"disk"``, ``"trainer"`` or ``"undefined"``."""

    def __init__(self, model):
        self.model = model
        self.disk = {name: p.detach().clone() for name, p in model.named_parameters()}
        self.backup, self.asleep, self.source = None, 0, "disk"

    def sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep(level={level}): level 1 offloads the weights, level 2 discards them")
        with torch.no_grad():
            self.backup = {n: p.detach().clone() for n, p in self.model.named_parameters()} if level == 1 else None
            for p in self.model.parameters():
                p.zero_()
        self.asleep = level

    def wake_up(self) -> None:
        if self.asleep == 1:
            self.model.load_state_dict(self.backup, strict=False)
        elif self.asleep == 2:
            self.source = "undefined"
        self.asleep, self.backup = 0, None

    @property
    def weights_dropped(self) -> bool:
        return self.source == "undefined"

    def reload_weights(self) -> None:
        """vLLM's ``collective_rpc("reload_weights")``: the weights of the checkpoint the engine was started from."""
        self.model.load_state_dict(self.disk, strict=False)
        self.source = "disk"

    def load_weights(self, state: dict) -> None:
        self.model.load_state_dict(state, strict=False)
        self.source = "trainer"


def hooks_for(engine: Engine, trainer, wake: str, level: int = 2):
    """``(push, before_rollout, after_rollout)`` for ``weight_sync.sync_training``: the sync wakes the engine and loads
    the trainer's weights; ``generate()`` wakes it and, with ``wake="disk_reload"`` (bug), reloads the checkpoint on
    disk, with ``"trainer_reload"`` (fix) restores dropped weights from the trainer; after sampling it sleeps at
    ``level``. Each rollout's weight source is appended to ``engine.sampled_with``. ``trainer``'s current weights are
    the first ones to restore (TRL syncs before its first generation too)."""
    if wake not in WAKES:
        raise ValueError(f"wake={wake!r}; use one of {WAKES} ('trainer_reload' is the fix)")
    engine.sampled_with, latest = [], {"state": {n: p.detach().clone() for n, p in trainer.named_parameters()}}

    def push(trainer, sampler):
        latest["state"] = {n: p.detach().clone() for n, p in trainer.named_parameters()}
        engine.wake_up()
        engine.load_weights(latest["state"])

    def before_rollout(sampler, step):
        engine.wake_up()
        if wake == "disk_reload":
            engine.reload_weights()
        elif engine.weights_dropped:
            engine.load_weights(latest["state"])
        engine.sampled_with.append(engine.source)

    def after_rollout(sampler, step):
        engine.sleep(level)

    return push, before_rollout, after_rollout


# ---- sweeps --------------------------------------------------------------------------------------
def sleep_runs(model, tokenizer, problems, *, seeds: list[int], steps: int, lr: float = 1e-3, level: int = 2,
               batch_size: int = 8) -> dict:
    """``{wake: [history per seed]}``: a trainer (a copy of ``model``) and an ``Engine`` on another copy, synced after
    every update, sleeping at ``level`` after every rollout; each record carries the rollout's weight source."""
    runs = {}
    for wake, seed in progress.track([(w, s) for w in WAKES for s in seeds], "sleep/wake runs", unit="run"):
        trainer, engine = copy.deepcopy(model), Engine(copy.deepcopy(model))
        push, before, after = hooks_for(engine, trainer, wake, level)
        engine.sleep(level)  # TRL puts the engine to sleep once it is built
        history = ws.sync_training(trainer, engine.model, tokenizer, problems, steps=steps, sync_interval=1, push=push,
                                   batch_size=batch_size, lr=lr, seed=seed, initial=model, before_rollout=before,
                                   after_rollout=after)
        for record, source in zip(history, engine.sampled_with, strict=True):
            record["sampled_with"] = source
        runs.setdefault(wake, []).append(history)
    return {"runs": runs, "seeds": list(seeds), "steps": steps, "level": level}


def gap_effect(result: dict) -> statistics.Effect:
    return statistics.effect({"bug": result["runs"]["disk_reload"], "fix": result["runs"]["trainer_reload"]}, "gap", "bug", "fix")


def sources(result: dict, wake: str) -> dict[str, int]:
    """How many rollouts (all seeds) sampled with weights from each source."""
    counts = {}
    for run in result["runs"][wake]:
        for h in run:
            counts[h["sampled_with"]] = counts.get(h["sampled_with"], 0) + 1
    return counts


def headline_row(result: dict) -> dict:
    e = gap_effect(result)
    bug = result["runs"]["disk_reload"]
    return {"bug": e.bug, "fix": e.fix, "effect": e.difference, "se": e.noise, "mde": e.mde, "seeds": e.seeds,
            "first": float(np.mean([run[1]["gap"] for run in bug])) if result["steps"] > 1 else float("nan"),
            "fix_max": max(h["gap"] for run in result["runs"]["trainer_reload"] for h in run),
            "drift_match": max(abs(h["gap"] - h["drift"]) for run in bug for h in run)}


# ---- verdict -------------------------------------------------------------------------------------
PREDICTION = statistics.Prediction("gap", "sampler–trainer log-prob gap over the last quarter of the steps", "+", "nats/token")


def verdict(result: dict, *, gap_threshold: float = 1e-2, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed).

    Reproduced: every bug rollout after step 0 sampled with the checkpoint on disk although a sync had written the
    trainer's weights, and the bug's last-quarter gap exceeds ``gap_threshold`` nats/token. Fixed: every fix rollout
    after step 0 sampled with the trainer's weights and its gap is ≤ ``tolerance`` at every step.
    """
    def after_first(wake):
        return {h["sampled_with"] for run in result["runs"][wake] for h in run if h["step"] > 0}
    head = headline_row(result)
    reproduced = after_first("disk_reload") == {"disk"} and head["bug"] > gap_threshold
    fixed = after_first("trainer_reload") == {"trainer"} and head["fix_max"] <= tolerance
    return reproduced, fixed


def not_shown(result: dict, *, gap_threshold: float = 1e-2) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when the trainer did not move, the checkpoint on disk
    is the trainer's policy and reloading it changes nothing."""
    head = headline_row(result)
    if head["bug"] > gap_threshold:
        return None
    return ws.no_update_reason(list(result["runs"].values())) or (
        f"the trainer moved too little in {result['steps']} steps (bug's gap {head['bug']:.1e} ≤ {gap_threshold:g} "
        "nats/token) for the checkpoint on disk to differ from it; raise the learning rate or the steps")


# ---- figures -------------------------------------------------------------------------------------
LABELS = {"disk_reload": "bug: wake reloads the disk", "trainer_reload": "fix: wake restores the trainer's"}


def plot_gap(ax, result: dict) -> None:
    """Mean |log μ − log π_θ| per token over steps, bug and fix, ± std over seeds."""
    runs = {LABELS[w]: result["runs"][w] for w in WAKES}
    plots.plot_bands(ax, runs, "gap", "gap, nats/token", plots.bug_fix_colors(list(runs)))
    ax.set_title(f"sampler vs trainer, sleep level {result['level']}", fontsize=10)


def plot_drift(ax, result: dict) -> None:
    """The bug's gap against the trainer's drift from the initial weights, per step (seed means): on the diagonal."""
    runs = result["runs"]["disk_reload"]
    gap = np.mean([[h["gap"] for h in run] for run in runs], axis=0)
    drift = np.mean([[h["drift"] for h in run] for run in runs], axis=0)
    top = float(max(gap.max(), drift.max(), 1e-3)) * 1.05
    ax.plot([0, top], [0, top], color=plots.NEUTRAL_COLOR, ls=":", label="gap = drift")
    ax.plot(drift, gap, "o", color=plots.BUG_COLOR, label="bug, per step")
    ax.set_xlabel("|log π_θ − log π_0|, trainer's drift")
    ax.set_ylabel("bug's gap, nats/token")
    ax.set_title("the engine samples π_0", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")


def figure_sleep_wake(result: dict):
    fig, axes = plots.panel_grid(2, panel_height=3.4)
    plot_gap(axes[0], result)
    plot_drift(axes[1], result)
    plots.figure_legend(fig, axes[0], ncol=2)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def lifecycle_lines(result: dict, steps: int = 3) -> str:
    """The first ``steps`` steps of seed 0, each wake's source of weights, bug and fix."""
    lines = []
    for wake in WAKES:
        run = result["runs"][wake][0]
        trace = "; ".join(f"step {h['step']}: sampled with {h['sampled_with']} weights (gap {h['gap']:.2g})" for h in run[:steps])
        lines.append(f"{LABELS[wake]} — {trace}")
    return "\n".join(lines)


def sleep_note(result: dict) -> str:
    return ("Left: mean |log μ − log π_θ| per sampled token, μ from the engine copy, π_θ from the trainer, before each step's "
            f"update; the trainer's weights are pushed after every update, and the engine sleeps at level {result['level']} "
            "after every rollout. Right: per step, the bug's gap against the trainer's mean |log π_θ − log π_0| on the same "
            "tokens; dotted: equality (the engine samples the checkpoint on disk).")


def headline_sentence(result: dict) -> str:
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    if not reproduced:
        return f"not reproduced: {not_shown(result) or 'see the verdict'}"
    return (f"every wake reloaded the checkpoint on disk ({sources(result, 'disk_reload')}): the gap grew from {head['first']:.3f} "
            f"after the first update to {head['bug']:.3f} nats/token over the last quarter (bug − fix {head['effect']:+.3f} ± "
            f"{head['se']:.2g} s.e., seeds {result['seeds']}; TRL #5312: 0.015 → 0.201); restored from the trainer "
            f"({sources(result, 'trainer_reload')}) the gap stays ≤ {head['fix_max']:.1e}" + (" (fixed)." if fixed else " — not fixed."))


# ---- explorer ------------------------------------------------------------------------------------
def sleep_explorer(result: dict) -> Explorer:
    """Pick a seed and a measure (gap, KL estimate, drift): bug and fix over steps for that seed, redrawn."""

    def draw(seed, measure):
        index = result["seeds"].index(seed)
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        for wake in WAKES:
            run = result["runs"][wake][index]
            ax.plot([h["step"] for h in run], [h[measure] for h in run], "o-", markersize=3, label=LABELS[wake],
                    color=plots.BUG_COLOR if wake == "disk_reload" else plots.FIX_COLOR)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{measure}, nats/token")
        ax.legend(fontsize=8)
        last = result["runs"]["disk_reload"][index][-1][measure]
        ax.set_title(f"seed {seed}: bug's last {measure} {last:.3f}", fontsize=9)
        return {"seed": seed, "measure": measure, "bug_last": last}

    return Explorer({"seed": widgets.Dropdown(options=result["seeds"], value=result["seeds"][0], description="seed"),
                     "measure": widgets.Dropdown(options=["gap", "kl", "drift"], value="gap", description="measure")},
                    draw, title="P39: what the engine samples with after a wake")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(result: dict, task: str = "arith") -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 39."""
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    return dict(
        notebook="39_sleep_wake_weights", reproduced=reproduced, fixed=fixed, not_shown=not_shown(result),
        metrics={"seeds": result["seeds"], "steps": result["steps"], "level": result["level"],
                 "sampled_with": {w: sources(result, w) for w in WAKES}, "gap_effect": vars(gap_effect(result)),
                 "fix_max_gap": head["fix_max"], "bug_gap_minus_drift": head["drift_match"], "engine_cpu": ENGINE_CPU_NOTE,
                 "prediction": PREDICTION.record({"gap": gap_effect(result)}, task),
                 "gap_by_step": {w: np.mean([[h["gap"] for h in run] for run in runs], axis=0).tolist()
                                 for w, runs in result["runs"].items()}},
        headline={"what": f"sampler–trainer log-prob gap over the last quarter of {result['steps']} steps, sleep level "
                          f"{result['level']} (seeds {result['seeds']})", "unit": "nats/token", "bug": head["bug"], "fix": head["fix"]},
    )
