"""Pitfall P8: pad token = EOS token.

Trainers that infer the loss mask as ``ids != pad`` (TRL's old PPOTrainer built its masks from
``ids != pad``) drop every EOS when the pad token *is* EOS: the policy is never trained to stop,
and its responses run to the length limit. ``compare`` trains a fresh tiny model (or any
checkpoint: a built-in name or a folder) by SFT both ways and measures how often its greedy answers stop.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.modeling.tiny import ARCHITECTURES, tiny_model
from workbench.tasks import Problem, encode_prompts, score_responses
from workbench.trainers.sft import SFTConfig, SFTTrainer, sft_batch
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements -------------------------------------------------------------------------------
def starting_model(name: str, *, seed: int = 0, device: str = "auto", pad_token: str | None = "auto"):
    """``(model, tokenizer)`` to fine-tune: ``tiny-<arch>`` (``tiny-qwen2``, ``tiny-llama``, ``tiny-gpt2``)
    or a bare architecture name is a tiny model built from scratch with ``seed``; any other name or
    folder goes to ``workbench.experiments.checkpoints.load``."""
    arch = name.removeprefix("tiny-")
    if arch in ARCHITECTURES:
        return tiny_model(arch, seed=seed)
    return load(name, device=device, pad_token=pad_token)


def sft_run(problems: list[Problem], *, pad_equals_eos: bool, steps: int, seed: int = 0, arch: str = "qwen2", on_step=None,
            **loading):
    """A model (``starting_model(arch)``: a tiny one from scratch by default) trained by SFT; returns
    ``(model, tokenizer, history)``. ``on_step(record)`` is called after each step (a progress bar); ``loading``:
    ``device``, ``pad_token`` for a checkpoint."""
    model, tokenizer = starting_model(arch, seed=seed, **loading)
    config = SFTConfig(steps=steps, seed=seed, learning_rate=3e-3, warmup_steps=min(50, steps // 5 + 1),
                       pad_equals_eos=pad_equals_eos, progress=False)
    history = SFTTrainer(model, tokenizer, problems, config).train(on_step=on_step)
    return model, tokenizer, history


@torch.no_grad()
def stopping_stats(model, tokenizer, problems: list[Problem], *, max_new_tokens: int = 16) -> dict:
    """Greedy generation: share of responses that produced EOS, mean length, accuracy."""
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    model.eval()
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, greedy=True)
    rewards = score_responses(tokenizer, problems, rollout.response_ids, rollout.response_mask, rollout.finished)
    return {"finished_fraction": float(rollout.finished.float().mean()),
            "mean_length": float(rollout.response_lengths.float().mean()), "accuracy": float(rewards.mean())}


def eos_targets_kept(tokenizer, problems: list[Problem], *, pad_equals_eos: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The SFT batch's ids and loss mask, and how many EOS targets the mask keeps."""
    ids, _, loss_mask = sft_batch(tokenizer, problems, pad_equals_eos=pad_equals_eos)
    return ids, loss_mask, int(((ids == tokenizer.eos_token_id) & loss_mask.bool()).sum())


# ---- sweeps -------------------------------------------------------------------------------------
def compare(train: list[Problem], test: list[Problem], *, steps: int, seed: int = 0, arch: str = "qwen2",
            max_new_tokens: int = 16, **loading) -> dict[bool, dict]:
    """Train ``arch`` (a tiny architecture, or any name or folder: ``starting_model``) with pad ≠ EOS
    (False) and pad = EOS (True); greedy stopping stats of each. A bar counts the steps of both runs (hidden in batch
    runs: ``core.progress``)."""
    stats = {}
    with progress.bar(2 * steps, "SFT, distinct pad then pad = EOS", unit="step") as bar:
        for bug in (False, True):
            model, tokenizer, _ = sft_run(train, pad_equals_eos=bug, steps=steps, seed=seed, arch=arch,
                                          on_step=lambda _record: bar.update(1), **loading)
            stats[bug] = stopping_stats(model, tokenizer, test, max_new_tokens=max_new_tokens)
    return stats


def sft_masks(tokenizer, problems: list[Problem]) -> dict[bool, tuple[torch.Tensor, torch.Tensor, int]]:
    """``eos_targets_kept`` with a distinct pad and with pad = EOS: ``{pad_equals_eos: (ids, loss_mask, EOS kept)}``."""
    return {bug: eos_targets_kept(tokenizer, problems, pad_equals_eos=bug) for bug in (False, True)}


def eos_kept(masks: dict[bool, tuple]) -> dict[bool, int]:
    """EOS targets each SFT loss mask of ``sft_masks`` keeps, ``{pad_equals_eos: count}``."""
    return {bug: kept for bug, (_, _, kept) in masks.items()}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(stats: dict[bool, dict], *, low: float = 0.1, high: float = 0.9) -> tuple[bool, bool]:
    """(reproduced, fixed): with pad = EOS fewer than ``low`` of greedy answers stop; with a distinct pad more than ``high``."""
    return bool(stats[True]["finished_fraction"] < low), bool(stats[False]["finished_fraction"] > high)


def not_shown(stats: dict[bool, dict], *, high: float = 0.9) -> str | None:
    """Why this run cannot show the fix, or None: when the distinct-pad model, after this run's SFT
    budget, stops on no more than ``high`` of its greedy answers (a checkpoint whose answers take
    several BPE tokens learns to stop more slowly than the character-level tiny model)."""
    fix, bug = stats[False]["finished_fraction"], stats[True]["finished_fraction"]
    if fix > high:
        return None
    return (f"with a distinct pad, only {fix:.0%} of greedy answers stop after this run's SFT steps (the verdict asks for more "
            f"than {high:.0%}; with pad = EOS {bug:.0%} stop): train longer (sft_steps) to see the fix in full")


# ---- figures ------------------------------------------------------------------------------------
def plot_sft_mask(ax, masks: dict[bool, tuple], eos_token_id: int, *, pad_equals_eos: bool) -> None:
    """The SFT loss mask of ``masks[pad_equals_eos]`` (``sft_masks``) with EOS cells marked (hatched where the mask
    drops them), titled with the EOS targets it keeps."""
    ids, loss_mask, kept = masks[pad_equals_eos]
    is_eos = ids == eos_token_id
    first_eos = is_eos & (is_eos.long().cumsum(-1) == 1)
    title = "pad = EOS, mask = ids != pad (bug)" if pad_equals_eos else "distinct pad, explicit mask (fix)"
    plots.plot_mask(ax, loss_mask, f"{title}: {kept} EOS targets kept", eos=first_eos)


def figure_sft_masks(masks: dict[bool, tuple], eos_token_id: int):
    """The SFT loss mask with a distinct pad (fix) above pad = EOS (bug), each with its key on the right."""
    return plots.figure_row(lambda axes: [plot_sft_mask(ax, masks, eos_token_id, pad_equals_eos=bug)
                                          for ax, bug in zip(axes, (False, True), strict=True)],
                            2, (plots.NOTEBOOK_WIDTH, 2.4), columns=1)


def plot_stopping(axes, stats: dict[bool, dict], max_new_tokens: int = 16) -> None:
    """Share of greedy answers that stop, and their mean length, bug vs fix (values written on the bars)."""
    labels, colors = ["distinct pad (fix)", "pad = EOS (bug)"], [plots.FIX_COLOR, plots.BUG_COLOR]
    for ax, key, scale, ylabel in ((axes[0], "finished_fraction", 100, "greedy responses that stop (%)"),
                                   (axes[1], "mean_length", 1, f"mean response length (tokens, limit {max_new_tokens})")):
        values = [stats[False][key] * scale, stats[True][key] * scale]
        ax.bar(labels, values, color=colors)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.1f}", ha="center", va="bottom")
        ax.set_ylabel(ylabel)


def figure_stopping(stats: dict[bool, dict]):
    """``plot_stopping`` on two panels side by side."""
    return plots.figure_row(lambda axes: plot_stopping(axes, stats), 2, (plots.NOTEBOOK_WIDTH, 3.4))


# ---- printers -----------------------------------------------------------------------------------
def stopping_lines(stats: dict[bool, dict]) -> str:
    return "\n".join(f"pad_equals_eos={bug}: {s['finished_fraction']:.0%} stop, mean length {s['mean_length']:.1f}, "
                     f"accuracy {s['accuracy']:.2f}" for bug, s in stats.items())


# ---- explorer -----------------------------------------------------------------------------------
def pad_eos_explorer(masks: dict[bool, tuple], eos_token_id: int) -> Explorer:
    """P8: the SFT loss mask with pad ≠ EOS or pad = EOS (``masks``: ``sft_masks``); counts the EOS targets it keeps."""

    def draw(pad_equals_eos):
        fig, ax = plt.subplots(figsize=(9.0, 2.5))  # 9 in: the key on the right stays inside the output area
        plot_sft_mask(ax, masks, eos_token_id, pad_equals_eos=pad_equals_eos)
        return {"eos_kept": masks[pad_equals_eos][2]}

    return Explorer({"pad_equals_eos": widgets.Checkbox(value=True, description="pad = EOS (bug)")}, draw,
                    "Which targets the loss keeps")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, stats: dict[bool, dict], kept: dict[bool, int]) -> dict:
    """Notebook 08's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(stats)
    return {
        "notebook": "08_pad_equals_eos", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(stats),
        "metrics": {"finished_fraction_bug": stats[True]["finished_fraction"], "finished_fraction_fix": stats[False]["finished_fraction"],
                    "mean_length_bug": stats[True]["mean_length"], "mean_length_fix": stats[False]["mean_length"],
                    "eos_targets_kept": {"bug": kept[True], "fix": kept[False]}},
        "headline": {"what": "greedy responses that stop with EOS after SFT", "unit": "share",
                     "bug": stats[True]["finished_fraction"], "fix": stats[False]["finished_fraction"]},
    }
