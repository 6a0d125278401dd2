"""Pitfall P38: tied embeddings out of sync — the sync updates ``embed_tokens`` while the sampler's untied ``lm_head``
stays stale.

With ``tie_word_embeddings`` one tensor is both the input embedding and the output head: the trainer's optimizer moves
it through both roles, and an HF-style state (``named_parameters()``, ``save_pretrained``) names it once, as
``model.embed_tokens.weight``. A rollout engine that holds the head as a *separate* tensor keeps the old head unless
the sync writes both names: prime-rl's sparse filesystem sync (PR #2823, 2026) cloned ``embed_tokens`` into a
separate ``lm_head.weight`` in its receiver cache, so patches that carry only the embedding key left the head stale;
vLLM PR #51665 ("Fix weight tying", 2026) re-ties a head it had untied, because "updating the weights of the
embedding would not propagate to the LM head" in RL. Nothing fails: the sampler's input side follows the trainer, its
output distribution stays at step 0's head, and the sampler–trainer gap grows with training at any sync interval.

This module builds the untied sampler copy (``untied_copy``), the two payloads (``named_payload``: each tensor once,
the bug; ``aliased_payload``: every name of every tensor, the fix) and runs ``workbench.experiments.weight_sync``'s
loop with each, beside a sampler that is never synced (the scale of full staleness), over seeds.
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

PAYLOADS = ("named", "aliased", "none")  # the bug, the fix, no sync at all (the scale)
HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


# ---- measurements --------------------------------------------------------------------------------
def is_tied(model) -> bool:
    """True when the output head and the input embedding are one tensor (``tie_word_embeddings`` in effect)."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and head.weight is embed.weight


def untied_copy(model):
    """A copy of ``model`` whose output head is its own tensor, equal to the embedding: what an engine that loads a
    tied checkpoint into separate ``embed_tokens`` and ``lm_head`` buffers holds (same outputs until one moves)."""
    sampler = copy.deepcopy(model)
    head = sampler.get_output_embeddings()
    head.weight = torch.nn.Parameter(sampler.get_input_embeddings().weight.detach().clone())
    return sampler


def named_payload(trainer) -> dict[str, torch.Tensor]:
    """The bug: each parameter once, by its first name (``named_parameters()``'s default, the HF state without the
    tied head): a tied head travels only as ``model.embed_tokens.weight``."""
    return {name: p.detach() for name, p in trainer.named_parameters()}


def aliased_payload(trainer) -> dict[str, torch.Tensor]:
    """The fix: every name of every parameter (``remove_duplicate=False``), so a receiver with an untied head gets
    ``lm_head.weight`` too."""
    return {name: p.detach() for name, p in trainer.named_parameters(remove_duplicate=False)}


def push_for(payload: str):
    """``push(trainer, sampler)`` loading ``payload`` (``"named"`` bug, ``"aliased"`` fix, ``"none"``: no sync)."""
    if payload not in PAYLOADS:
        raise ValueError(f"payload={payload!r}; use one of {PAYLOADS} ('aliased' is the fix)")

    def push(trainer, sampler):
        if payload != "none":
            sampler.load_state_dict((named_payload if payload == "named" else aliased_payload)(trainer), strict=False)
    return push


def head_staleness(trainer, sampler) -> float:
    """max |sampler's lm_head − trainer's head|: 0 when the head arrived."""
    return float((sampler.get_output_embeddings().weight - trainer.get_output_embeddings().weight).detach().abs().max())


# ---- sweeps --------------------------------------------------------------------------------------
def sync_runs(model, tokenizer, problems, *, seeds: list[int], steps: int, lr: float = 1e-3, batch_size: int = 8) -> dict:
    """``{payload: [history per seed]}``: a full-parameter trainer (``model``'s copy, tied) and an untied sampler
    copy, the payload pushed after every update; each history's last record carries ``head_staleness`` and the
    payload's names of seed 0 are kept (``"sent"``)."""
    runs, sent = {}, {}
    for payload, seed in progress.track([(p, s) for p in PAYLOADS for s in seeds], "sync runs", unit="run"):
        trainer, sampler = copy.deepcopy(model), untied_copy(model)
        history = ws.sync_training(trainer, sampler, tokenizer, problems, steps=steps, sync_interval=1,
                                   push=push_for(payload), batch_size=batch_size, lr=lr, seed=seed, initial=model)
        history[-1]["head_staleness"] = head_staleness(trainer, sampler)
        history[-1]["embed_staleness"] = float((sampler.get_input_embeddings().weight
                                                - trainer.get_input_embeddings().weight).detach().abs().max())
        runs.setdefault(payload, []).append(history)
        if seed == seeds[0] and payload != "none":
            names = (named_payload if payload == "named" else aliased_payload)(trainer)
            sent[payload] = {"tensors": len(names), "has_head": HEAD in names, "has_embed": EMBED in names}
    return {"runs": runs, "sent": sent, "tied": is_tied(model), "seeds": list(seeds), "steps": steps}


def gap_effect(result: dict) -> statistics.Effect:
    """bug − fix of the gap over the last quarter of the steps, paired by seed."""
    return statistics.effect({"bug": result["runs"]["named"], "fix": result["runs"]["aliased"]}, "gap", "bug", "fix")


def final(result: dict, payload: str, key: str) -> float:
    """Largest ``key`` of the last record over the seeds of ``payload``."""
    return max(run[-1][key] for run in result["runs"][payload])


def headline_row(result: dict) -> dict:
    """The bug's gap over the last quarter with its s.e., the fix's, and the unsynced sampler's for scale."""
    e = gap_effect(result)
    return {"bug": e.bug, "fix": e.fix, "effect": e.difference, "se": e.noise, "seeds": e.seeds,
            "none": float(np.mean([statistics.tail_mean(run, "gap") for run in result["runs"]["none"]])),
            "fix_max": max(h["gap"] for run in result["runs"]["aliased"] for h in run)}


# ---- verdict -------------------------------------------------------------------------------------
PREDICTION = statistics.Prediction("gap", "sampler–trainer log-prob gap over the last quarter of the steps", "+", "nats/token")


def verdict(result: dict, *, gap_threshold: float = 1e-2, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed).

    Reproduced: the model is tied, the bug's payload lacks ``lm_head.weight``, the sampler's head is stale at the end
    (> ``tolerance``) while its embedding arrived (≤ ``tolerance``), and the bug's last-quarter gap exceeds
    ``gap_threshold`` nats/token. Fixed: the aliased payload carries the head, leaves it fresh, and keeps the gap
    ≤ ``tolerance`` at every step.
    """
    head = headline_row(result)
    sent = result["sent"]
    reproduced = (result["tied"] and not sent["named"]["has_head"] and final(result, "named", "head_staleness") > tolerance
                  and final(result, "named", "embed_staleness") <= tolerance and head["bug"] > gap_threshold)
    fixed = sent["aliased"]["has_head"] and final(result, "aliased", "head_staleness") <= tolerance and head["fix_max"] <= tolerance
    return reproduced, fixed


def not_shown(result: dict, *, gap_threshold: float = 1e-2) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: an untied checkpoint has a head of its own, which every
    payload names; a policy that did not move leaves nothing stale."""
    if not result["tied"]:
        return ("this checkpoint does not tie its output head to its input embedding (tie_word_embeddings is False): "
                "lm_head.weight is its own parameter and every payload sends it; use a tied checkpoint (Qwen2-style)")
    bug = headline_row(result)["bug"]
    if bug <= gap_threshold:
        return ws.no_update_reason(list(result["runs"].values())) or (
            f"the trainer moved too little in {result['steps']} steps for a stale head to show (bug's gap {bug:.1e} ≤ "
            f"{gap_threshold:g} nats/token); raise the learning rate or the steps")
    return None


# ---- figures -------------------------------------------------------------------------------------
LABELS = {"named": "bug: each tensor once", "aliased": "fix: every name", "none": "never synced"}


def plot_gap(ax, result: dict) -> None:
    """Mean |log μ − log π_θ| per token over steps, bug and fix, ± std over seeds (the never-synced sampler, an order
    of magnitude above, is printed, not drawn)."""
    runs = {LABELS[p]: result["runs"][p] for p in ("named", "aliased")}
    colors = {LABELS["named"]: plots.BUG_COLOR, LABELS["aliased"]: plots.FIX_COLOR}
    plots.plot_bands(ax, runs, "gap", "gap, nats/token", colors)
    ax.set_title("sampler vs trainer, sync every step", fontsize=10)


def plot_staleness(ax, result: dict) -> None:
    """At the end: max |sampler − trainer| of the embedding and of the head, per payload (bars, 0 labelled)."""
    x = np.arange(2)
    for i, (payload, color) in enumerate((("named", plots.BUG_COLOR), ("aliased", plots.FIX_COLOR))):
        values = [final(result, payload, "embed_staleness"), final(result, payload, "head_staleness")]
        bars = ax.bar(x + (i - 0.5) * 0.38, values, 0.38, color=color, label=LABELS[payload])
        plots.label_zero_bars(ax, bars)
    ax.set_xticks(x, ["embed_tokens", "lm_head"])
    ax.set_ylabel("max |sampler − trainer|")
    ax.set_title(f"after {result['steps']} syncs", fontsize=10)


def figure_tied_sync(result: dict):
    """The notebook's figure: the gap over steps (left), which tensor went stale (right)."""
    fig, axes = plots.panel_grid(2, panel_height=3.4)
    plot_gap(axes[0], result)
    plot_staleness(axes[1], result)
    plots.figure_legend(fig, axes[0], ncol=2)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def payload_lines(result: dict) -> str:
    return "\n".join(f"{LABELS[p]}: {s['tensors']} tensors, model.embed_tokens.weight {'sent' if s['has_embed'] else 'missing'}, "
                     f"lm_head.weight {'sent' if s['has_head'] else 'missing'}" for p, s in result["sent"].items()) + \
        f"\ncheckpoint tied: {result['tied']}"


def tied_note(result: dict) -> str:
    """The caption printed under ``figure_tied_sync``."""
    return ("Left: mean |log μ − log π_θ| per sampled token, μ from the sampler copy (its head untied), π_θ from the tied "
            "trainer, before each step's update; the payload is pushed after every update. A sampler never synced, the "
            f"scale of full staleness, reaches {headline_row(result)['none']:.2f} over the last quarter (not drawn). "
            "Right: the largest difference between the sampler's and the trainer's embedding "
            "and head after the last sync (max over seeds); a bar labelled 0 is exactly 0.")


def headline_sentence(result: dict) -> str:
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    if not reproduced:
        return f"not reproduced: {not_shown(result) or 'see the verdict'}"
    return (f"syncing every step, the bug's gap grew to {head['bug']:.3f} nats/token over the last quarter (bug − fix "
            f"{head['effect']:+.3f} ± {head['se']:.2g} s.e., seeds {result['seeds']}; never synced: {head['none']:.3f}): the "
            f"sampler's head stayed at step 0 ({final(result, 'named', 'head_staleness'):.2g} away) while its embedding "
            f"arrived; the fix's gap stays ≤ {head['fix_max']:.1e}" + (" (fixed)." if fixed else " — not fixed."))


# ---- explorer ------------------------------------------------------------------------------------
def tied_explorer(result: dict) -> Explorer:
    """Pick a seed and a measure: the three samplers over steps for that seed, redrawn."""

    def draw(seed, measure):
        index = result["seeds"].index(seed)
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        for payload, color in (("named", plots.BUG_COLOR), ("aliased", plots.FIX_COLOR), ("none", plots.NEUTRAL_COLOR)):
            run = result["runs"][payload][index]
            ax.plot([h["step"] for h in run], [h[measure] for h in run], "o-", color=color, label=LABELS[payload], markersize=3)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{measure}, nats/token")
        ax.legend(fontsize=8)
        last = result["runs"]["named"][index][-1][measure]
        ax.set_title(f"seed {seed}: bug's last {measure} {last:.3f}", fontsize=9)
        return {"seed": seed, "measure": measure, "bug_last": last}

    return Explorer({"seed": widgets.Dropdown(options=result["seeds"], value=result["seeds"][0], description="seed"),
                     "measure": widgets.Dropdown(options=["gap", "kl", "drift"], value="gap", description="measure")},
                    draw, title="P38: a tied head synced under one name")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(result: dict, task: str = "arith") -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 38."""
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    return dict(
        notebook="38_tied_embeddings_sync", reproduced=reproduced, fixed=fixed, not_shown=not_shown(result),
        metrics={"tied": result["tied"], "sent": result["sent"], "seeds": result["seeds"], "steps": result["steps"],
                 "gap_effect": vars(gap_effect(result)), "never_synced_gap": head["none"], "fix_max_gap": head["fix_max"],
                 "staleness": {p: {k: final(result, p, k) for k in ("embed_staleness", "head_staleness")} for p in PAYLOADS},
                 "prediction": PREDICTION.record({"gap": gap_effect(result)}, task),
                 "gap_by_step": {p: np.mean([[h["gap"] for h in run] for run in runs], axis=0).tolist()
                                 for p, runs in result["runs"].items()}},
        headline={"what": f"sampler–trainer log-prob gap over the last quarter of {result['steps']} steps, synced every step "
                          f"(seeds {result['seeds']})", "unit": "nats/token", "bug": head["bug"], "fix": head["fix"]},
    )
