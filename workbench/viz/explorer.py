"""ipywidgets explorers for the notebooks: controls that redraw a plot.

Every explorer is an ``Explorer``: a set of value widgets, a ``draw(**values)`` function that
plots into the explorer's ``Output`` and returns what it measured, and an observer that calls
``draw`` again whenever a control's ``.value`` changes. The logic is testable without a browser:
set ``explorer.controls["name"].value`` and read ``explorer.last`` / ``explorer.renders``.

Notebooks show ``explorer.widget`` only when their ``interactive`` parameter is true (batch runs
set it to False).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from IPython.display import clear_output

from workbench.core import losses
from workbench.viz import plots


class Explorer:
    """Controls + an output area redrawn by ``draw(**control_values)`` on every change."""

    def __init__(self, controls: dict[str, widgets.ValueWidget], draw: Callable[..., Any], title: str = ""):
        self.controls = controls
        self.draw = draw
        self.output = widgets.Output()
        self.last: Any = None
        self.renders = 0
        for control in controls.values():
            control.observe(self._redraw, names="value")
        header = [widgets.HTML(f"<b>{title}</b>")] if title else []
        self.widget = widgets.VBox(header + [widgets.HBox(list(controls.values())), self.output])
        self._redraw()

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _redraw(self, change=None) -> None:
        with self.output:
            clear_output(wait=True)
            self.last = self.draw(**self.values())
            plt.show()
        self.renders += 1


# --------------------------------------------------------------------------------------------
# S1: drift by architecture, dtype, pad length and position-ids mode
# --------------------------------------------------------------------------------------------
def position_drift_explorer(texts: list[str], seed: int = 0) -> Explorer:
    """Per-token |Δ log p| between each text alone and in a left-padded batch."""
    from workbench.modeling.models import ARCHITECTURES, tiny_model
    from workbench.pitfalls.nb01_position_ids import per_text_drift, plot_drift_per_text

    cache: dict = {}

    def model_for(arch, dtype):
        if (arch, dtype) not in cache:
            cache[arch, dtype] = tiny_model(arch, seed=seed, dtype=torch.float32 if dtype == "fp32" else torch.bfloat16)
        return cache[arch, dtype]

    def draw(arch, dtype, pad, position_ids):
        model, tokenizer = model_for(arch, dtype)
        rows = [tokenizer(t)["input_ids"] for t in texts]
        drift = per_text_drift(model, rows, pad_token_id=tokenizer.pad_token_id, extra_pad=pad, position_ids=position_ids)
        fig, ax = plt.subplots(figsize=(7, 3))
        plot_drift_per_text(ax, texts, {position_ids: drift})
        ax.set_title(f"{arch} {dtype}, +{pad} left pads, position_ids={position_ids}")
        return {"max_drift": max(drift)}

    controls = {
        "arch": widgets.Dropdown(options=list(ARCHITECTURES), value="gpt2", description="arch"),
        "dtype": widgets.ToggleButtons(options=["fp32", "bf16"], value="fp32", description="dtype"),
        "pad": widgets.IntSlider(value=4, min=0, max=32, description="extra pads"),
        "position_ids": widgets.ToggleButtons(options=["model", "mask"], value="model", description="position_ids"),
    }
    return Explorer(controls, draw, "Logit drift: pick an architecture, dtype, pad length and the fix")


# --------------------------------------------------------------------------------------------
# S2: padding side of batched cached generation
# --------------------------------------------------------------------------------------------
def padding_side_explorer(models: dict[str, tuple], prompts: list[str]) -> Explorer:
    """Rows whose greedy continuation differs from generating alone (the notebook's figure, one model);
    ``last["divergent_rows"]`` is the count for the chosen padding side."""
    from workbench.pitfalls.nb02_right_padding_flash_attention import divergence_sweep, plot_divergence

    cache: dict = {}

    def draw(model_name, side):
        if model_name not in cache:
            cache[model_name] = divergence_sweep({model_name: models[model_name]}, prompts)[0]
        fig, ax = plt.subplots(figsize=(6, 3))
        plot_divergence(ax, cache[model_name])
        ax.set_title(f"{model_name}: {side} padding selected")
        return {"divergent_rows": cache[model_name][model_name][f"{side}_divergent_rows"]}

    controls = {
        "model_name": widgets.Dropdown(options=list(models), description="model"),
        "side": widgets.ToggleButtons(options=["right", "left"], value="right", description="padding"),
    }
    return Explorer(controls, draw, "Batched cached generation: right vs left padding")


# --------------------------------------------------------------------------------------------
# S3: decoding budget and batch size
# --------------------------------------------------------------------------------------------
def eos_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """Decoding steps and wasted tokens with and without EOS stopping."""
    from workbench.pitfalls.nb03_eos_termination import cost_sweep, plot_generation_cost

    def draw(batch_size, max_new_tokens):
        costs = cost_sweep(model, tokenizer, prompts, [batch_size], max_new_tokens=max_new_tokens, seed=seed)
        fig, axes = plt.subplots(1, 3, figsize=(12, 2.8))
        plot_generation_cost(axes, costs)
        return costs[batch_size]

    controls = {
        "batch_size": widgets.IntSlider(value=16, min=1, max=len(prompts), description="batch size"),
        "max_new_tokens": widgets.IntSlider(value=16, min=2, max=64, description="max_new_tokens"),
    }
    return Explorer(controls, draw, "What decoding past EOS costs")


# --------------------------------------------------------------------------------------------
# S4: DPO loss masks
# --------------------------------------------------------------------------------------------
def dpo_mask_explorer(batch) -> Explorer:
    """The loss mask of a concatenated chosen+rejected batch for each prompt_mask mode."""
    from workbench.pitfalls.nb04_dpo_loss_mask import plot_loss_mask
    from workbench.trainers.dpo import PROMPT_MASK_MODES

    def draw(prompt_mask):
        fig, ax = plt.subplots(figsize=(7, 3))
        return {"rows_counting_prompt": plot_loss_mask(ax, batch, prompt_mask)}

    controls = {"prompt_mask": widgets.ToggleButtons(options=list(PROMPT_MASK_MODES), value="chosen_only", description="mask")}
    return Explorer(controls, draw, "DPO loss mask: toggle the bug")


# --------------------------------------------------------------------------------------------
# S5: per-token gradient weight by loss aggregation mode
# --------------------------------------------------------------------------------------------
def loss_mode_explorer() -> Explorer:
    """Per-token and per-response gradient weight for a loss mode and a length spread."""
    from workbench.pitfalls.nb05_grpo_loss_normalization import analytic_token_weights, plot_token_weights

    def draw(mode, longest):
        lengths = sorted({1, max(1, longest // 4), max(1, longest // 2), longest})
        fig, axes = plt.subplots(1, 2, figsize=(10, 3))
        plot_token_weights(axes[0], axes[1], lengths, [mode])
        axes[0].set_title(mode)
        return {"lengths": lengths, "weights": analytic_token_weights(lengths, mode)}

    controls = {
        "mode": widgets.Dropdown(options=list(losses.LOSS_AGG_MODES), value="token-mean", description="loss_agg"),
        "longest": widgets.IntSlider(value=16, min=2, max=256, description="longest L"),
    }
    return Explorer(controls, draw, "Gradient weight per token and per response")


# --------------------------------------------------------------------------------------------
# P6–P13
# --------------------------------------------------------------------------------------------
def temperature_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """P6: first-step max |ρ − 1| for a sampling temperature, with or without dividing by it."""
    from workbench.pitfalls.nb06_temperature import first_step_ratio, plot_ratio_vs_temperature

    def draw(temperature, rescale):
        result = first_step_ratio(model, tokenizer, prompts, temperature=temperature, rescale=rescale, seed=seed)
        other = first_step_ratio(model, tokenizer, prompts, temperature=temperature, rescale=not rescale, seed=seed)
        fig, ax = plt.subplots(figsize=(6, 3))
        plot_ratio_vs_temperature(ax, {(temperature, rescale): result, (temperature, not rescale): other})
        return result

    controls = {"temperature": widgets.FloatSlider(value=0.7, min=0.2, max=2.0, step=0.1, description="τ"),
                "rescale": widgets.Checkbox(value=False, description="divide by τ (fix)")}
    return Explorer(controls, draw, "Sampling temperature vs the recomputed log-probs")


def dropout_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """P7: step-0 ratio and KL for a dropout probability, with or without disabling dropout."""
    from workbench.pitfalls.nb07_dropout import plot_step0, step0_mismatch

    def draw(dropout, disable):
        result = step0_mismatch(model, tokenizer, prompts, dropout=dropout, disable=disable, seed=seed)
        other = step0_mismatch(model, tokenizer, prompts, dropout=dropout, disable=not disable, seed=seed)
        fig, axes = plt.subplots(1, 2, figsize=(10, 3))
        plot_step0(axes, {(dropout, disable): result, (dropout, not disable): other})
        return result

    controls = {"dropout": widgets.FloatSlider(value=0.1, min=0.0, max=0.5, step=0.01, description="dropout"),
                "disable": widgets.Checkbox(value=False, description="disable dropout (fix)")}
    return Explorer(controls, draw, "Dropout during RL: step-0 ratio and KL")


def pad_eos_explorer(tokenizer, problems) -> Explorer:
    """P8: the SFT loss mask with pad ≠ EOS or pad = EOS; counts the EOS targets it keeps."""
    from workbench.pitfalls.nb08_pad_equals_eos import plot_sft_mask

    def draw(pad_equals_eos):
        fig, ax = plt.subplots(figsize=(7, 2.5))
        return {"eos_kept": plot_sft_mask(ax, tokenizer, problems, pad_equals_eos=pad_equals_eos)}

    return Explorer({"pad_equals_eos": widgets.Checkbox(value=True, description="pad = EOS (bug)")}, draw,
                    "Which targets the loss keeps")


def kl_gradient_explorer(noise_scales: list[float], values: dict, gradients: dict) -> Explorer:
    """P9: cosine of each estimator's expected gradient with ∇KL, at a chosen policy distance."""
    from workbench.pitfalls.nb09_kl_estimators import plot_gradients

    def draw(scale_index):
        scale = noise_scales[scale_index]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3))
        plot_gradients(axes, {scale: values[scale]}, {scale: gradients[scale]})
        axes[0].set_title(f"noise {scale}: exact KL {values[scale]['exact_kl']:.3f} nats/token")
        return gradients[scale]

    return Explorer({"scale_index": widgets.IntSlider(value=len(noise_scales) - 1, min=0, max=len(noise_scales) - 1,
                                                      description="distance")}, draw, "Gradient of each KL choice")


def grad_accumulation_explorer(mask: torch.Tensor, micro_batch_counts: list[int], errors: dict | None = None) -> Explorer:
    """P10: the notebook's figure — relative gradient error vs micro-batches (``errors`` from
    ``grad_accumulation.sweep``), the chosen count marked — above the per-token weights of that split,
    bug (mean of means) vs fix (global token count). Without ``errors`` only the weights are drawn."""
    from workbench.pitfalls.nb10_grad_accumulation import plot_gradient_error

    def draw(micro_batches):
        chunks = torch.arange(mask.shape[0]).chunk(micro_batches)
        tokens = [int(mask[c].sum()) for c in chunks]
        bug = [1 / t / len(tokens) for t in tokens]
        result = {"tokens": tokens, "bug_weights": bug, "fix_weight": 1 / sum(tokens)}
        if errors is not None:
            fig, (ax, weights_ax) = plt.subplots(2, 1, figsize=(7, 6.5), height_ratios=(2, 1))
            plot_gradient_error(ax, micro_batch_counts, errors)
            i = list(micro_batch_counts).index(micro_batches)
            ax.axvline(micro_batches, color=plots.NEUTRAL_COLOR, lw=0.8, ls=":")
            result.update(error_bug=errors["per_micro_batch"][i], error_fix=errors["global"][i])
            ax.set_title(f"{micro_batches} micro-batches: relative error {result['error_bug']:.2e} (bug) vs "
                         f"{result['error_fix']:.1e} (fix)", fontsize=9)
        else:
            fig, weights_ax = plt.subplots(figsize=(6, 2.5))
        weights_ax.bar(range(len(tokens)), bug, color=plots.BUG_COLOR, label="per-token weight, bug")
        weights_ax.axhline(1 / sum(tokens), color=plots.FIX_COLOR, label="per-token weight, fix")
        weights_ax.set_xlabel("micro-batch")
        weights_ax.set_ylabel("weight")
        weights_ax.legend(fontsize=8)
        fig.tight_layout()
        return result

    control = widgets.Dropdown(options=list(micro_batch_counts), value=micro_batch_counts[-1], description="micro-batches")
    return Explorer({"micro_batches": control}, draw, "Gradient error and token weights under accumulation")


def curve_explorer(histories: dict, key: str, ylabel: str, colors: dict | None = None) -> Explorer:
    """One run's curve at a time (P11: EOS rate per truncation variant, and similar), drawn by ``plots.plot_curves``."""

    def draw(run):
        values = [h[key] for h in histories[run]]
        fig, ax = plt.subplots(figsize=(6, 2.5))
        steps = [{"step": i, **h} if "step" not in h else h for i, h in enumerate(histories[run])]
        plots.plot_curves(ax, {run: steps}, key, ylabel, colors)
        return {"last": values[-1], "first": values[0]}

    return Explorer({"run": widgets.Dropdown(options=list(histories), description="run")}, draw, f"{ylabel} per run")


def log_ratio_explorer(results: dict, cap: float = 1.02) -> Explorer:
    """P12: the trainer/rollout log-ratio histogram and TIS clipped share of a rollout engine (the notebook's figure)."""
    from workbench.pitfalls.nb12_logprob_mismatch import plot_mismatch

    def draw(rollout):
        result = results[rollout]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3))
        plot_mismatch(axes, {rollout: result}, cap)
        return {"max_ratio_deviation": result["max_ratio_deviation"]}

    return Explorer({"rollout": widgets.ToggleButtons(options=list(results), description="sampler")}, draw,
                    "Rollout engine vs trainer")


def whitening_explorer(values: torch.Tensor, mask: torch.Tensor) -> Explorer:
    """P13: real-token mean/std after naive and masked whitening, as padding columns are added."""
    from workbench.pitfalls.nb13_whitening import plot_whitening, whitening_vs_padding

    def draw(extra):
        rows = whitening_vs_padding(values, mask, sorted({0, extra}))
        fig, axes = plt.subplots(1, 2, figsize=(10, 3))
        plot_whitening(axes, rows)
        axes[0].set_title(f"0 and +{extra} pad columns")
        return rows[-1]

    return Explorer({"extra": widgets.IntSlider(value=8, min=0, max=64, description="extra pads")}, draw,
                    "Whitening over padding vs real tokens")
