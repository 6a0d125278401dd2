"""Pitfall P17: which token ends a response — three sources that can disagree.

A checkpoint names its stop token in three places: ``tokenizer.eos_token``,
``generation_config.eos_token_id`` (an id or a list), and, implicitly, its chat template, which
ends every assistant turn with some token (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3).
A base checkpoint fine-tuned on chat data (Qwen3 #927; the rlhf-book Qwen3 SFT write-up) learns
to end turns with the template's token while its tokenizer and generation config still say
``<|endoftext|>``. Then:

* a rollout that stops on the generation config's EOS never stops: the policy emits its turn end
  and keeps going to the length limit, and every response is "truncated";
* a rollout that does stop on the turn end but a trainer that recognises only the tokenizer's
  EOS counts every response as truncated (missing-EOS penalty, overlong filtering, zero reward).

The fix: stop ids = tokenizer EOS ∪ generation-config EOS ∪ the template's turn end, used both
to stop sampling and to decide that a response finished.
"""

from __future__ import annotations

import textwrap

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.batching import pad_sequences
from workbench.modeling import realistic
from workbench.modeling.models import load_tokenizer
from workbench.modeling.rollout import sample
from workbench.modeling.stop_ids import SOURCES, stop_id_sources, union_stop_ids
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements -------------------------------------------------------------------------------
def audit(folder) -> dict:
    """For a checkpoint folder: the sources, their union, and whether the template's turn end is a
    stop id of the tokenizer / the generation config (None without a template)."""
    from transformers import GenerationConfig  # transformers: seconds to import; loaded where a model is

    sources = stop_id_sources(GenerationConfig.from_pretrained(str(folder), local_files_only=True), load_tokenizer(folder))
    turn_end = sources["template_turn_end"]
    covered = {name: (set(turn_end) <= set(sources[name])) if turn_end else None for name in ("tokenizer", "generation_config")}
    return {"sources": sources, "union": union_stop_ids(sources), "turn_end_covered_by": covered}


def chat_prompt_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                for p in prompts]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]


@torch.no_grad()
def rollout_under(model, tokenizer, prompts: list[str], *, stop_ids: list[int], finished_ids: list[int],
                  max_new_tokens: int = 32, seed: int = 0) -> dict:
    """Sample responses that stop on ``stop_ids``; count a response finished when it contains one
    of ``finished_ids`` (what the trainer recognises as EOS). Returns the costs and the counts."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    device = model.device
    ids, mask = (t.to(device) for t in pad_sequences(chat_prompt_ids(tokenizer, prompts), pad, side="left"))
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop_ids, pad_token_id=pad,
                     generator=torch.Generator(device).manual_seed(seed))
    counted = torch.isin(rollout.response_ids, torch.tensor(finished_ids, device=device)) & rollout.response_mask.bool()
    finished = counted.any(-1)
    return {
        "stopped_fraction": float(rollout.finished.float().mean()),
        "counted_finished_fraction": float(finished.float().mean()),
        "truncated_fraction": 1.0 - float(finished.float().mean()),
        "miscounted_fraction": float((rollout.finished & ~finished).float().mean()),  # stopped, yet counted truncated
        "mean_length": float(rollout.response_lengths.float().mean()),
        "tokens_generated_per_response": rollout.tokens_generated / len(prompts),
        "example": tokenizer.decode(rollout.response_ids[0][rollout.response_mask[0].bool()]),
    }


# ---- sweeps -------------------------------------------------------------------------------------
def scenarios(sources: dict[str, list[int]]) -> dict[str, dict[str, list[int]]]:
    """The configurations compared: ``{name: {"stop_ids", "finished_ids"}}``."""
    union = union_stop_ids(sources)
    return {
        "stop on generation config": {"stop_ids": union_stop_ids(sources, ("generation_config",)),
                                      "finished_ids": union_stop_ids(sources, ("generation_config",))},
        "stop on turn end, count tokenizer EOS": {"stop_ids": union_stop_ids(sources, ("template_turn_end",)),
                                                  "finished_ids": union_stop_ids(sources, ("tokenizer",))},
        "union of all three (fix)": {"stop_ids": union, "finished_ids": union},
    }


# ---- verdict ------------------------------------------------------------------------------------
def not_shown(sources: dict[str, list[int]]) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when the tokenizer's EOS and the generation
    config both already name the template's turn end, every partial stop set stops at it."""
    turn_end = set(sources["template_turn_end"])
    if not turn_end:
        return "the tokenizer has no chat template, so there is no turn-end token to miss; use a -chat checkpoint"
    if turn_end <= set(sources["tokenizer"]) and turn_end <= set(sources["generation_config"]):
        return (f"the tokenizer's EOS and the generation config both already name the turn end {sorted(turn_end)}: no "
                "partial stop set misses it (a base checkpoint fine-tuned on ChatML, realistic-qwen2-base-chat, shows it)")
    return None


def verdict(bug_truncated: float, fix_counted_finished: float, stopped_on_turn_end: float, *,
            signature: float = 0.5) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: more than ``signature`` of the responses counted truncated with a partial stop set; with
    the union, every response that stopped on the turn end alone is counted finished (``fix_counted_finished ≥
    stopped_on_turn_end``: the same seed samples the same tokens up to the first stop, and the union contains the turn
    end) and more than ``signature`` are. Responses left truncated under the union emitted no stop id within the
    budget — a sampling outcome, not a counting error: one of 8 in bf16 on a GPU (docs/journal/2026-11-27.md), none on the CPU."""
    return bug_truncated > signature, fix_counted_finished >= stopped_on_turn_end and fix_counted_finished > signature


# ---- figures ------------------------------------------------------------------------------------
SCENARIO_COLORS = (plots.BUG_COLOR, plots.NEUTRAL_COLOR, plots.FIX_COLOR)  # the two partial stop sets, the union (fix)


def _labels(runs: dict) -> list[str]:
    """The configurations' names wrapped to a bar's width."""
    return [textwrap.fill(n, 14, break_long_words=False) for n in runs]


def plot_truncated(ax, runs: dict, colors=SCENARIO_COLORS) -> None:
    """Share of responses counted as truncated per stop-set configuration (``rollout_under`` results)."""
    plots.label_zero_bars(ax, ax.bar(_labels(runs), [100 * r["truncated_fraction"] for r in runs.values()], color=colors))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("counted as truncated (%)")


def plot_decode_steps(ax, runs: dict, max_new_tokens: int, colors=SCENARIO_COLORS) -> None:
    """Tokens generated per response per configuration, against the length limit."""
    ax.bar(_labels(runs), [r["tokens_generated_per_response"] for r in runs.values()], color=colors)
    ax.tick_params(axis="x", labelsize=8)
    ax.axhline(max_new_tokens, color=plots.NEUTRAL_COLOR, ls="--")
    ax.annotate("length\nlimit", (1, max_new_tokens), xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                va="center", fontsize=8)  # beside the line, where no legend box covers it
    ax.set_ylabel("tokens generated per response")


def figure_stopping(runs: dict, max_new_tokens: int):
    """The notebook's figure: ``plot_truncated`` and ``plot_decode_steps`` side by side."""
    fig, axes = plots.panel_grid(2, panel_height=3.6)
    plot_truncated(axes[0], runs)
    plot_decode_steps(axes[1], runs, max_new_tokens)
    fig.tight_layout()
    return fig


# ---- printers -----------------------------------------------------------------------------------
def caption_note(n_prompts: int, max_new_tokens: int) -> str:
    """The caption under the figure."""
    return (f"Each bar: the same {n_prompts} chat prompts sampled under one stop-id "
            "configuration. Left: responses the trainer counts as truncated (no token of its finished set); a written 0 is a "
            f"bar of height 0. Right: tokens sampled per response; the dashed line is the length limit ({max_new_tokens}).")


def checkpoint_audit_lines() -> str:
    """``audit`` of every realistic checkpoint flavour: its sources, and whether they cover the template's turn end."""
    lines = []
    for flavour in realistic.FLAVOURS:
        a = audit(realistic.checkpoint(flavour))
        lines.append(f"{flavour:10s} sources {a['sources']}, turn end covered by tokenizer / generation config: "
                     f"{a['turn_end_covered_by']['tokenizer']} / {a['turn_end_covered_by']['generation_config']}")
    return "\n".join(lines)


def run_lines(runs: dict) -> str:
    return "\n".join(f"{name:40s} stopped {r['stopped_fraction']:.0%}, counted truncated {r['truncated_fraction']:.0%}, "
                     f"{r['tokens_generated_per_response']:.1f} tokens/response, e.g. {r['example'][:60]!r}" for name, r in runs.items())


# ---- explorer -----------------------------------------------------------------------------------
def stop_source_explorer(model, tokenizer, prompts: list[str], sources: dict[str, list[int]], *, max_new_tokens: int = 32,
                         seed: int = 0) -> Explorer:
    """Which source sampling stops on, and which the trainer counts as finished: the two bars redrawn from a new rollout."""
    options = [*SOURCES, "union"]

    def draw(stop_on, count_on):
        try:
            ids = {key: union_stop_ids(sources, SOURCES if name == "union" else (name,))
                   for key, name in (("stop_ids", stop_on), ("finished_ids", count_on))}
        except ValueError as error:  # a source that names no id: nothing to sample with
            print(error)
            return {"error": str(error)}
        run = rollout_under(model, tokenizer, prompts, max_new_tokens=max_new_tokens, seed=seed, **ids)
        name = f"stop on {stop_on}, count {count_on}"
        fixed = stop_on == count_on == "union"
        color = [plots.FIX_COLOR if fixed else plots.BUG_COLOR]
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        plot_truncated(axes[0], {name: run}, color)
        plot_decode_steps(axes[1], {name: run}, max_new_tokens, color)
        fig.tight_layout()
        return run

    controls = {"stop_on": widgets.Dropdown(options=options, value="generation_config", description="stop on"),
                "count_on": widgets.Dropdown(options=options, value="generation_config", description="count")}
    return Explorer(controls, draw, title="P17: the stop ids sampling uses and the ones the trainer counts")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(runs: dict, sources: dict[str, list[int]]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 17 (``runs``: the three ``scenarios``, in order)."""
    never_stops, counted_wrong, union = runs.values()
    reproduced, fixed = verdict(min(never_stops["truncated_fraction"], counted_wrong["truncated_fraction"]),
                                union["counted_finished_fraction"], counted_wrong["stopped_fraction"])
    return dict(
        notebook="17_stop_tokens", not_shown=not_shown(sources), reproduced=reproduced, fixed=fixed,
        metrics={"sources": sources, "runs": {n: {k: v for k, v in r.items() if k != "example"} for n, r in runs.items()}},
        headline={"what": "responses counted as truncated (sampling stops on the generation config's EOS)", "unit": "fraction",
                  "bug": never_stops["truncated_fraction"], "fix": union["truncated_fraction"]},
    )
