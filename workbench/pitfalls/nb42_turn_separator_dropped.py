"""Pitfall P42: the turn separator dropped where token-in/token-out pieces are stitched at an assistant → tool boundary.

A multi-turn tool agent builds its token sequence piece by piece (token-in/token-out, TITO): the prompt ids, the ids
the sampler returned for the assistant turn, then the ids of the tool's reply, then the next assistant turn. The
sampler stops at the assistant's turn end (``<|im_end|>`` in ChatML); the template writes a separator after it
(``"\\n"``, ``Ċ``) that the model never emits. verl's ``ToolAgentLoop`` then rendered the tool message alone with
``apply_chat_template`` — which starts at ``<|im_start|>`` — and appended it, so one ``Ċ`` went missing at every
assistant → tool boundary (verl PR #6921, merged 2026-07). The stitched sequence is no longer the template's rendering
of the conversation: every later token is scored and sampled in a context the model never saw in training,

    Δ_t = log π(y_t | stitched without Ċ) − log π(y_t | the template's rendering) ≠ 0  for every later y_t.

The fix: derive the separator from the template (what a rendered message holds after its turn-end token) and insert
it between the sampled turn end and the tool message; the stitched ids then equal the template's rendering. Measured
here: the exact token lost, and the shift Δ of the next assistant turn's tokens, sampled from the correct context.
"""

from __future__ import annotations

import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.batching import pad_sequences
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import all_problems
from workbench.viz import plots
from workbench.viz.explorer import Explorer

SENTINEL = "Zq7"  # a content string no template writes, to cut a rendering at a message's end


# ---- measurements -------------------------------------------------------------------------------
def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def turn_separator_ids(tokenizer, turn_end_id: int) -> list[int]:
    """The ids the chat template writes after an assistant message's turn-end token, inside that message
    (``[Ċ]`` for ChatML, ``[]`` for Llama 3): what a sampler that stops at the turn end never emits (the fix)."""
    turn_end = tokenizer.convert_ids_to_tokens(turn_end_id)
    text = render(tokenizer, [{"role": "assistant", "content": SENTINEL}], add_generation_prompt=False)
    marker = SENTINEL + turn_end
    if marker not in text:
        raise ValueError(f"the chat template does not end an assistant message with {turn_end!r}")
    return encode(tokenizer, text.split(marker, 1)[1])


def tool_turn_ids(tokenizer, tool_message: str) -> list[int]:
    """The tool message rendered alone, with the next generation prompt — how the agent loop encoded it
    (a template's leading BOS is left out: it is not a separator)."""
    text = render(tokenizer, [{"role": "tool", "content": tool_message}], add_generation_prompt=True)
    bos = tokenizer.bos_token
    return encode(tokenizer, text[len(bos):] if bos and text.startswith(bos) else text)


def template_tail_ids(tokenizer, turn_end_id: int, tool_message: str) -> list[int]:
    """The reference: what the template writes after an assistant turn end up to the next generation prompt
    when it renders the whole conversation, encoded as one piece."""
    turn_end = tokenizer.convert_ids_to_tokens(turn_end_id)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SENTINEL},
                {"role": "tool", "content": tool_message}]
    tail = render(tokenizer, messages, add_generation_prompt=True).split(SENTINEL + turn_end, 1)[1]
    return encode(tokenizer, tail)


def stitch(prompt: list[int], sampled: list[int], turn_end_id: int, separator: list[int], tool: list[int], *,
           drop_separator: bool) -> list[int]:
    """TITO context for the next assistant turn: prompt + sampled turn + turn end (+ separator unless dropped) + tool."""
    return prompt + sampled + [turn_end_id] + ([] if drop_separator else separator) + tool


@torch.no_grad()
def tool_episodes(model, tokenizer, n_episodes: int, *, turn_end_id: int, max_new_tokens: int = 12,
                  seed: int = 0) -> list[dict]:
    """Arithmetic questions; turn 1 sampled up to its turn end; a calculator tool replies with the exact sum; the
    next assistant turn is sampled from the template's rendering (the reference). Per episode: the contexts
    ``reference``, ``bug`` (separator dropped) and ``fix`` (separator inserted), and ``turn2`` (its ids)."""
    problems = random.Random(seed).sample(all_problems(), n_episodes)
    generator = torch.Generator().manual_seed(seed)
    pad = tokenizer.pad_token_id
    prompts = [encode(tokenizer, render(tokenizer, [{"role": "user", "content": p.prompt}], add_generation_prompt=True))
               for p in problems]
    first = _sample(model, prompts, turn_end_id, pad, max_new_tokens, generator)
    separator = turn_separator_ids(tokenizer, turn_end_id)
    episodes = []
    for problem, prompt, turn1 in zip(problems, prompts, first, strict=True):
        if turn1 is None:
            continue  # a truncated turn has no turn end to stitch after
        tool = tool_turn_ids(tokenizer, problem.answer)
        head = prompt + turn1 + [turn_end_id]
        episodes.append({"question": problem.prompt, "tool_message": problem.answer, "turn1": turn1,
                         "reference": head + template_tail_ids(tokenizer, turn_end_id, problem.answer),
                         "bug": stitch(prompt, turn1, turn_end_id, separator, tool, drop_separator=True),
                         "fix": stitch(prompt, turn1, turn_end_id, separator, tool, drop_separator=False),
                         "boundary": len(head)})
    second = _sample(model, [e["reference"] for e in episodes], turn_end_id, pad, max_new_tokens, generator, keep_open=True)
    for episode, turn2 in zip(episodes, second, strict=True):
        episode["turn2"] = turn2
    return [e for e in episodes if e["turn2"]]


def _sample(model, prompts, turn_end_id, pad, max_new_tokens, generator, keep_open: bool = False) -> list:
    if not prompts:  # no first turn finished: no episode to continue
        return []
    ids, mask = pad_sequences(prompts, pad, side="left")
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=turn_end_id, pad_token_id=pad,
                     generator=generator)
    out = []
    for row, keep, done in zip(rollout.response_ids, rollout.response_mask, rollout.finished, strict=True):
        tokens = row[keep.bool()].tolist()
        out.append(tokens if keep_open else (tokens[:-1] if bool(done) else None))  # turn 1: content without turn end
    return out


def lost_tokens(reference: list[int], stitched: list[int]) -> list[int]:
    """The ids of ``reference`` missing from ``stitched`` at their first difference (``[]`` when equal)."""
    start = next((i for i, (a, b) in enumerate(zip(reference, stitched, strict=False)) if a != b), min(len(reference), len(stitched)))
    if reference == stitched:
        return []
    end = start + max(len(reference) - len(stitched), 1)
    return reference[start:end]


@torch.no_grad()
def continuation_logprobs(model, contexts: list[list[int]], continuations: list[list[int]], pad: int) -> torch.Tensor:
    """Per-token log π of each continuation after its context, (episodes, longest continuation), 0 past the end."""
    c_ids, c_mask = pad_sequences(contexts, pad, side="left")
    r_ids, r_mask = pad_sequences(continuations, pad, side="right")
    return response_logprobs(model, c_ids, c_mask, r_ids, r_mask).float() * r_mask


def separator_shift(model, tokenizer, episodes: list[dict]) -> dict:
    """The next assistant turn's per-token log-probs after the bug's and the fix's stitched context minus those after
    the template's rendering; the tokens lost at the boundary; whether each stitching equals the rendering."""
    pad = tokenizer.pad_token_id
    turn2 = [e["turn2"] for e in episodes]
    reference = continuation_logprobs(model, [e["reference"] for e in episodes], turn2, pad)
    shift = {v: continuation_logprobs(model, [e[v] for e in episodes], turn2, pad) - reference for v in ("bug", "fix")}
    lengths = torch.tensor([len(t) for t in turn2])
    lost = [lost_tokens(e["reference"], e["bug"]) for e in episodes]
    out = {"episodes": len(episodes), "turn2_tokens": int(lengths.sum()), "lengths": lengths,
           "lost_ids": lost[0] if lost else [], "lost_tokens": tokenizer.convert_ids_to_tokens(lost[0]) if lost and lost[0] else [],
           "lost_per_episode": sum(len(x) for x in lost) / max(len(lost), 1)}
    for variant in ("bug", "fix"):
        delta = shift[variant]
        out[f"shift_{variant}"] = delta
        out[f"sequence_shift_{variant}"] = delta.sum(-1)
        out[f"equals_template_{variant}"] = sum(e[variant] == e["reference"] for e in episodes) / max(len(episodes), 1)
        out[f"mean_abs_token_shift_{variant}"] = float(delta.abs().sum() / lengths.sum().clamp(min=1))
        out[f"max_abs_sequence_shift_{variant}"] = float(delta.sum(-1).abs().max()) if episodes else 0.0
        out[f"mean_abs_sequence_shift_{variant}"] = float(delta.sum(-1).abs().mean()) if episodes else 0.0
    return out


# ---- verdict ------------------------------------------------------------------------------------
def verdict(stats: dict, *, signature: float = 0.01, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: the bug's stitching loses a token at the boundary and moves the next turn's
    log-probability by more than ``signature`` nats (mean |Σ Δ| per episode); the fix's stitching equals the
    template's rendering in every episode and moves nothing beyond ``tolerance``."""
    reproduced = bool(stats["lost_ids"]) and stats["mean_abs_sequence_shift_bug"] > signature
    fixed = stats["equals_template_fix"] == 1.0 and stats["max_abs_sequence_shift_fix"] <= tolerance
    return reproduced, fixed


NO_TEMPLATE = "this checkpoint has no chat template; the stitched multi-turn sequence is laid out by the chat template"


def no_episode_reason(max_new_tokens: int) -> str:
    """Why a sample of episodes left nothing to measure (no first turn ended), and the remedy."""
    return (f"no episode ended its first assistant turn within max_new_tokens={max_new_tokens}: use a chat-tuned "
            "checkpoint (e.g. realistic-qwen2-chat) or raise max_new_tokens")


def not_shown(stats: dict) -> str | None:
    """Why this checkpoint cannot show the pitfall (``None`` when ``verdict`` reproduced it)."""
    if verdict(stats)[0]:
        return None
    if not stats["lost_ids"]:
        return ("this chat template writes nothing after an assistant turn's end token (Llama 3: <|eot_id|> is followed "
                "directly by <|start_header_id|>), so there is no separator to drop: use a ChatML checkpoint "
                "(realistic-qwen2-chat)")
    return (f"the separator {stats['lost_tokens']} is dropped but the next turn's log-probability moves by only "
            f"{stats['mean_abs_sequence_shift_bug']:.2g} nats per episode: use a chat-tuned checkpoint (realistic-qwen2-chat)")


# ---- figures ------------------------------------------------------------------------------------
def plot_sequence_shift(ax, stats: dict, highlight: int | None = None) -> None:
    """Σ Δ of each episode's next assistant turn: separator dropped (bug, bars) vs inserted (fix, squares)."""
    x = range(stats["episodes"])
    bars = ax.bar(x, stats["sequence_shift_bug"].numpy(), color=plots.BUG_COLOR, label="separator dropped (bug)")
    ax.plot(x, stats["sequence_shift_fix"].numpy(), "s", ms=3, color=plots.FIX_COLOR, label="separator inserted (fix)")
    if highlight is not None:
        bars[highlight].set_edgecolor(plots.NEUTRAL_COLOR)
        bars[highlight].set_linewidth(2)
    ax.axhline(0, color=plots.NEUTRAL_COLOR, lw=0.6)
    ax.set(xlabel="episode", ylabel="Σ Δ log π, next turn (nats)")
    plots.integer_axis(ax.xaxis)
    plots.legend_outside(ax, ncol=2)


def plot_token_shift(ax, stats: dict) -> None:
    """Mean |Δ log π| of the next assistant turn's tokens by their position after the tool message."""
    mask = torch.arange(stats["shift_bug"].shape[1])[None, :] < stats["lengths"][:, None]
    count = mask.sum(0).clamp(min=1)
    positions = range(1, mask.shape[1] + 1)
    for variant, color, marker in (("bug", plots.BUG_COLOR, "o-"), ("fix", plots.FIX_COLOR, "s--")):
        mean = (stats[f"shift_{variant}"].abs() * mask).sum(0) / count
        ax.plot(positions, mean.numpy(), marker, ms=3, color=color, label=f"{'dropped' if variant == 'bug' else 'inserted'} ({variant})")
    ax.set(xlabel="token of the next turn", ylabel="mean |Δ log π| (nats)")
    plots.integer_axis(ax.xaxis)
    plots.legend_outside(ax, ncol=2)


def figure_separator_shift(stats: dict):
    """The notebook's figure: each episode's Σ Δ (left) and the mean |Δ| by position (right)."""
    return plots.figure_panels((9.6, 3.6), lambda ax: plot_sequence_shift(ax, stats), lambda ax: plot_token_shift(ax, stats))


# ---- printers -----------------------------------------------------------------------------------
def boundary_lines(episode: dict, tokenizer, width: int = 4) -> str:
    """The tokens around the assistant → tool boundary in the template's rendering, the bug's and the fix's stitching."""
    at = episode["boundary"]
    lines = []
    for name in ("reference", "bug", "fix"):
        ids = episode[name][at - width : at + width]
        lines.append(f"{name:>9}: … {' '.join(tokenizer.convert_ids_to_tokens(ids))} …")
    return "\n".join(lines)


def stats_lines(stats: dict) -> str:
    """The token lost, how often each stitching equals the template's rendering, and the shift of the next turn."""
    return "\n".join([
        f"token lost at each assistant → tool boundary: {stats['lost_tokens']} (ids {stats['lost_ids']}), "
        f"{stats['lost_per_episode']:.2f} per episode",
        f"stitched ids equal the template's rendering: {stats['equals_template_bug']:.0%} (bug), {stats['equals_template_fix']:.0%} (fix)",
        f"next turn ({stats['episodes']} episodes, {stats['turn2_tokens']} tokens): |Σ Δ| mean "
        f"{stats['mean_abs_sequence_shift_bug']:.3f}, max {stats['max_abs_sequence_shift_bug']:.3f} nats, per token "
        f"{stats['mean_abs_token_shift_bug']:.4f} (bug); max {stats['max_abs_sequence_shift_fix']:.1e} (fix)",
    ])


def shift_note() -> str:
    return ("Δ = log π(token | stitched context) − log π(token | the template's rendering), for the next assistant turn "
            "sampled from the rendering; 0 means the stitched context is the rendering.")


# ---- explorer -----------------------------------------------------------------------------------
def episode_explorer(episodes: list[dict], stats: dict, tokenizer) -> Explorer:
    """P42: one episode — its boundary tokens stitched both ways and the shift of its next turn."""

    def draw(episode):
        fig, ax = plt.subplots(figsize=(9, 3.4))
        plot_sequence_shift(ax, stats, highlight=episode)
        e = episodes[episode]
        ax.set_title(f"{e['question']!r}: next turn {tokenizer.convert_ids_to_tokens(e['turn2'])[:8]}", fontsize=8)
        return {"episode": episode, "sequence_shift_bug": float(stats["sequence_shift_bug"][episode]),
                "sequence_shift_fix": float(stats["sequence_shift_fix"][episode])}

    slider = widgets.IntSlider(value=0, min=0, max=max(len(episodes) - 1, 0), description="episode")
    return Explorer({"episode": slider}, draw, "P42: the separator at an assistant → tool boundary")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(stats: dict) -> dict:
    """Notebook 42's ``notebook_api.write_metrics`` keyword arguments (per-token tensors stay out)."""
    reproduced, fixed = verdict(stats)
    scalars = {k: v for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    return {
        "notebook": "42_turn_separator_dropped", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(stats),
        "metrics": scalars,
        "headline": {"what": "mean |Σ Δ log π| of the next assistant turn after the boundary", "unit": "nats",
                     "bug": stats["mean_abs_sequence_shift_bug"], "fix": stats["mean_abs_sequence_shift_fix"]},
    }
