"""Pitfall P41: a chat template that strips earlier ``<think>`` blocks — turn N+1 is no longer an extension of turn N.

Qwen3's and Qwen3.5's chat templates drop the reasoning (``<think>…</think>``) of every assistant message before the
last user message: the model card's advice for chat. In multi-turn RL this breaks the sequence the sampler built.
The sampler produced turn 2 after ``prompt₁ + <think> R₁ </think> A₁ + user₂`` (its own ids, token-in/token-out); a
trainer or agent loop that re-renders the conversation with the template gets ``prompt₁ + A₁ + user₂``: the tokens of
R₁ are gone, the prefix check "turn N+1 starts with turn N's tokens" fails (verl issue #6854, a Qwen3.5 multi-turn GRPO
run), and every later token is scored in a context it was not sampled in,

    err_turn = Σ_t log π(y_t | re-rendered history) − Σ_t log π(y_t | the sampler's history) ≠ 0  at learning rate 0,

for turn 2's tokens and for turn 1's answer, which loses the reasoning it followed. TRL's fix is a prefix-preserving
training template (``trl.chat_template_utils.get_training_chat_template``: the thinking block always emitted — whose
first Qwen3.5 version put the thinking outside the block, issue #6361, fixed by PR #6363); tinker's renderer has a
``strip_thinking_from_history`` switch. Either way the trainer scores each turn after exactly the ids the sampler saw.

``QWEN3_STYLE_TEMPLATE`` below is a compact template with Qwen3's behaviour (ChatML, ``<think>\\n`` opened by the
generation prompt, reasoning stripped before the last user message unless ``keep_thinking=True``), applied to a
realistic ChatML checkpoint's tokenizer.
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

QWEN3_STYLE_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and '</think>' in m.content %}"
    "{%- if loop.index0 > ns.last_query or (keep_thinking is defined and keep_thinking) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + m.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"
SECOND_QUESTION = "And again?"


# ---- measurements -------------------------------------------------------------------------------
def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool, keep_thinking: bool = False) -> str:
    """``messages`` through ``QWEN3_STYLE_TEMPLATE`` (``keep_thinking``: the prefix-preserving training variant)."""
    return tokenizer.apply_chat_template(messages, chat_template=QWEN3_STYLE_TEMPLATE, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, keep_thinking=keep_thinking)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def _sample(model, contexts, turn_end_id, pad, max_new_tokens, generator, *, stop: bool) -> list[list[int]]:
    """Sampled ids per context; with ``stop`` up to and including the turn end, else the turn end is never kept."""
    if not contexts:  # no turn finished before: nothing to continue
        return []
    ids, mask = pad_sequences(contexts, pad, side="left")
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=turn_end_id, pad_token_id=pad,
                     generator=generator)
    out = []
    for row, keep in zip(rollout.response_ids, rollout.response_mask, strict=True):
        tokens = row[keep.bool()].tolist()
        out.append(tokens if stop else [t for t in tokens if t != turn_end_id])
    return out


def _sample_turns(model, tokenizer, heads, turn_end_id, think_tokens, max_new_tokens, generator):
    """One thinking turn after each ``head`` (ids ending at ``<|im_start|>assistant\\n``): ``<think>\\n`` R ``</think>`` A."""
    pad, open_ids, close_ids = tokenizer.pad_token_id, encode(tokenizer, THINK_OPEN), encode(tokenizer, THINK_CLOSE)
    reasoning = _sample(model, [h + open_ids for h in heads], turn_end_id, pad, think_tokens, generator, stop=False)
    answers = _sample(model, [h + open_ids + r + close_ids for h, r in zip(heads, reasoning, strict=True)], turn_end_id,
                      pad, max_new_tokens, generator, stop=True)
    return [{"think": open_ids + r + close_ids, "reasoning": r, "answer": a} for r, a in zip(reasoning, answers, strict=True)]


def thinking_episodes(model, tokenizer, n_episodes: int, *, turn_end_id: int, think_tokens: int = 8,
                      max_new_tokens: int = 8, seed: int = 0) -> list[dict]:
    """Two-turn thinking episodes sampled token-in/token-out: an arithmetic question, a thinking turn, a second user
    message, a second thinking turn. Per episode the ids ``head1`` (turn-1 prompt up to the assistant header),
    ``think1``/``answer1``, ``user2`` (the template's text between turn 1's end and turn 2's header, encoded),
    ``think2``/``answer2`` and the messages, for the template to render."""
    generator = torch.Generator().manual_seed(seed)
    questions = [p.prompt for p in random.Random(seed).sample(all_problems(), n_episodes)]
    header = encode(tokenizer, "<|im_start|>assistant\n")
    heads = [encode(tokenizer, render(tokenizer, [{"role": "user", "content": q}], add_generation_prompt=False)) + header
             for q in questions]
    first = _sample_turns(model, tokenizer, heads, turn_end_id, think_tokens, max_new_tokens, generator)
    user2 = encode(tokenizer, "\n" + render(tokenizer, [{"role": "user", "content": SECOND_QUESTION}],
                                            add_generation_prompt=False)) + header
    episodes = []
    for question, head, turn in zip(questions, heads, first, strict=True):
        if not turn["answer"] or turn["answer"][-1] != turn_end_id:
            continue  # a truncated first turn has no end to continue after
        episodes.append({"question": question, "head1": head, "think1": turn["think"], "answer1": turn["answer"],
                         "user2": user2})
    contexts = [tito_context(e) for e in episodes]
    second = _sample_turns(model, tokenizer, contexts, turn_end_id, think_tokens, max_new_tokens, generator)
    opened = len(encode(tokenizer, THINK_OPEN))
    for episode, turn in zip(episodes, second, strict=True):
        episode.update(think2=turn["think"], answer2=turn["answer"])
        content = tokenizer.decode(episode["think1"][opened:] + episode["answer1"][:-1])  # "R\n</think>\n\nA", as parsed
        episode["messages"] = [{"role": "user", "content": episode["question"]}, {"role": "assistant", "content": content},
                               {"role": "user", "content": SECOND_QUESTION}]
    return episodes


def tito_context(episode: dict) -> list[int]:
    """The ids the sampler saw before turn 2: its own turn-1 ids, thinking included (the fix scores turn 2 after these)."""
    return episode["head1"] + episode["think1"] + episode["answer1"] + episode["user2"]


def stripped_context(episode: dict) -> list[int]:
    """The turn-2 context as the stripping template lays it out: turn 1's ``<think>…</think>`` ids removed (the bug)."""
    return episode["head1"] + episode["answer1"] + episode["user2"]


def prefix_checks(tokenizer, episode: dict) -> dict:
    """Text-level checks against the template: does the re-rendered turn-2 prompt extend the sampler's sequence, with
    the stripping template (bug) and the prefix-preserving one (fix)? Is the bug's spliced context the stripping
    template's rendering?"""
    sampled = tokenizer.decode(tito_context(episode))
    rendered = {keep: render(tokenizer, episode["messages"], add_generation_prompt=True, keep_thinking=keep)
                for keep in (False, True)}
    return {"extends_bug": rendered[False].startswith(sampled), "extends_fix": rendered[True].startswith(sampled),
            "splice_is_rendering": tokenizer.decode(stripped_context(episode)) + THINK_OPEN == rendered[False]}


@torch.no_grad()
def span_logprobs(model, contexts: list[list[int]], spans: list[list[int]], pad: int) -> torch.Tensor:
    """Σ log π(span | context) per episode."""
    c_ids, c_mask = pad_sequences(contexts, pad, side="left")
    s_ids, s_mask = pad_sequences(spans, pad, side="right")
    return (response_logprobs(model, c_ids, c_mask, s_ids, s_mask).float() * s_mask).sum(-1)


def per_turn_errors(model, tokenizer, episodes: list[dict]) -> dict:
    """Per episode and turn, Σ log π of the turn's sampled tokens after the trainer's context minus after the sampler's:
    turn 2 (thinking and answer) after the stripped history (bug) or the sampler's ids (fix); turn 1's answer after
    no thinking (bug: the stripped rendering's view) or its own (fix). Also the tokens lost and the prefix checks."""
    pad = tokenizer.pad_token_id
    turn2 = [e["think2"] + e["answer2"] for e in episodes]
    answer1 = [e["answer1"] for e in episodes]
    sampler2 = span_logprobs(model, [tito_context(e) for e in episodes], turn2, pad)
    sampler1 = span_logprobs(model, [e["head1"] + e["think1"] for e in episodes], answer1, pad)
    error = {
        ("bug", 2): span_logprobs(model, [stripped_context(e) for e in episodes], turn2, pad) - sampler2,
        ("fix", 2): span_logprobs(model, [tito_context(e) for e in episodes], turn2, pad) - sampler2,
        ("bug", 1): span_logprobs(model, [e["head1"] for e in episodes], answer1, pad) - sampler1,
        ("fix", 1): span_logprobs(model, [e["head1"] + e["think1"] for e in episodes], answer1, pad) - sampler1,
    }
    checks = [prefix_checks(tokenizer, e) for e in episodes]
    lost = [len(e["think1"]) for e in episodes]
    n = max(len(episodes), 1)
    out = {"episodes": len(episodes), "lost_tokens_per_episode": sum(lost) / n, "lost": torch.tensor(lost, dtype=torch.float),
           "lost_example": tokenizer.convert_ids_to_tokens(episodes[0]["think1"]) if episodes else [],
           "turn2_tokens": sum(len(t) for t in turn2),
           **{f"{k}_fraction": sum(c[k] for c in checks) / n for k in ("extends_bug", "extends_fix", "splice_is_rendering")}}
    for (variant, turn), value in error.items():
        out[f"error_turn{turn}_{variant}"] = value
        out[f"mean_abs_error_turn{turn}_{variant}"] = float(value.abs().mean()) if episodes else 0.0
        out[f"max_abs_error_turn{turn}_{variant}"] = float(value.abs().max()) if episodes else 0.0
    return out


# ---- verdict ------------------------------------------------------------------------------------
def verdict(stats: dict, *, signature: float = 0.05, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: with the stripping template the re-rendered turn-2 prompt does not extend the sampler's
    ids in any episode and turn 2's log-probability moves by more than ``signature`` nats on average; with the
    prefix-preserving template every rendering extends the sampler's ids and no turn moves beyond ``tolerance``."""
    reproduced = stats["extends_bug_fraction"] == 0.0 and stats["mean_abs_error_turn2_bug"] > signature
    fixed = (stats["extends_fix_fraction"] == 1.0 and stats["max_abs_error_turn2_fix"] <= tolerance
             and stats["max_abs_error_turn1_fix"] <= tolerance)
    return reproduced, fixed


NO_CHATML = ("this checkpoint's tokenizer has no ChatML tokens (<|im_start|>, <|im_end|>): the Qwen3-style template "
             "is written for them — use a ChatML checkpoint (realistic-qwen2-chat)")


def chatml_turn_end(tokenizer) -> int | None:
    """The id of ``<|im_end|>``, the turn end ``QWEN3_STYLE_TEMPLATE`` writes, or ``None`` when the vocabulary lacks ChatML."""
    vocab = tokenizer.get_vocab()
    return vocab["<|im_end|>"] if {"<|im_start|>", "<|im_end|>"} <= set(vocab) else None


def no_episode_reason(max_new_tokens: int) -> str:
    return (f"no episode ended its first answer within max_new_tokens={max_new_tokens}: use a chat-tuned checkpoint "
            "(realistic-qwen2-chat) or raise max_new_tokens")


def not_shown(stats: dict) -> str | None:
    """Why the sample could not show the bug (``None`` when ``verdict`` reproduced it)."""
    if verdict(stats)[0]:
        return None
    return (f"the stripped history extends the sampler's ids in {stats['extends_bug_fraction']:.0%} of the episodes and "
            f"moves turn 2 by {stats['mean_abs_error_turn2_bug']:.2g} nats on average: use a chat-tuned ChatML checkpoint "
            "(realistic-qwen2-chat) or raise think_tokens")


# ---- figures ------------------------------------------------------------------------------------
def plot_turn_error(ax, stats: dict, turn: int, highlight: int | None = None) -> None:
    """Per episode, the turn's log-prob error: stripped history (bug, bars) vs the sampler's ids (fix, squares)."""
    x = range(stats["episodes"])
    bars = ax.bar(x, stats[f"error_turn{turn}_bug"].numpy(), color=plots.BUG_COLOR, label="earlier <think> stripped (bug)")
    ax.plot(x, stats[f"error_turn{turn}_fix"].numpy(), "s", ms=3, color=plots.FIX_COLOR, label="prefix-preserving (fix)")
    if highlight is not None:
        bars[highlight].set_edgecolor(plots.NEUTRAL_COLOR)
        bars[highlight].set_linewidth(2)
    ax.axhline(0, color=plots.NEUTRAL_COLOR, lw=0.6)
    what = "turn 2 (thinking + answer)" if turn == 2 else "turn 1's answer"
    ax.set(xlabel="episode", ylabel="log-prob error (nats)", title=what)
    plots.integer_axis(ax.xaxis)


def figure_turn_errors(stats: dict):
    """The notebook's figure: turn 2's error (left) and turn 1's answer's (right), per episode, one legend below."""
    fig, axes = plots.panel_grid(2, panel_height=3.4)
    plot_turn_error(axes[0], stats, 2)
    plot_turn_error(axes[1], stats, 1)
    plots.figure_legend(fig, axes[0], ncol=2)
    return fig


# ---- printers -----------------------------------------------------------------------------------
def lost_tokens_line(stats: dict) -> str:
    return (f"tokens the stripping template removes from turn 1 (episode 0): {stats['lost_example']} — "
            f"{stats['lost_tokens_per_episode']:.1f} per episode on average")


def stats_lines(stats: dict) -> str:
    return "\n".join([
        f"re-rendered turn-2 prompt extends the sampler's ids: {stats['extends_bug_fraction']:.0%} (stripping template), "
        f"{stats['extends_fix_fraction']:.0%} (prefix-preserving); spliced ids = the stripping rendering in "
        f"{stats['splice_is_rendering_fraction']:.0%}",
        f"turn 2 ({stats['episodes']} episodes, {stats['turn2_tokens']} tokens): |error| mean {stats['mean_abs_error_turn2_bug']:.3f}, "
        f"max {stats['max_abs_error_turn2_bug']:.3f} nats (bug); max {stats['max_abs_error_turn2_fix']:.1e} (fix)",
        f"turn 1's answer: |error| mean {stats['mean_abs_error_turn1_bug']:.3f}, max {stats['max_abs_error_turn1_bug']:.3f} nats (bug); "
        f"max {stats['max_abs_error_turn1_fix']:.1e} (fix)",
    ])


def rendering_lines(tokenizer, episode: dict) -> str:
    """The turn-2 prompt the sampler saw, and the stripping template's rendering of the same conversation."""
    sampled = tokenizer.decode(tito_context(episode))
    stripped = render(tokenizer, episode["messages"], add_generation_prompt=True)
    return f"sampler's turn-2 prompt:  {sampled!r}\nstripping template:       {stripped!r}"


def error_note() -> str:
    return ("error = Σ log π(turn's tokens | the trainer's history) − Σ log π(same tokens | the sampler's history), "
            "at learning rate 0; the fix scores every turn after the ids the sampler saw.")


# ---- explorer -----------------------------------------------------------------------------------
def episode_explorer(episodes: list[dict], stats: dict, tokenizer) -> Explorer:
    """P41: one episode — the thinking its turn 1 loses and each turn's error."""

    def draw(episode, turn):
        fig, ax = plt.subplots(figsize=(9, 3.4))
        plot_turn_error(ax, stats, turn, highlight=episode)
        e = episodes[episode]
        ax.set_title(f"{e['question']!r}: stripped {tokenizer.convert_ids_to_tokens(e['think1'])[:10]}", fontsize=8)
        return {"episode": episode, "turn": turn, "error_bug": float(stats[f"error_turn{turn}_bug"][episode]),
                "error_fix": float(stats[f"error_turn{turn}_fix"][episode])}

    controls = {"episode": widgets.IntSlider(value=0, min=0, max=max(len(episodes) - 1, 0), description="episode"),
                "turn": widgets.ToggleButtons(options=[("turn 2", 2), ("turn 1's answer", 1)], value=2, description="turn")}
    return Explorer(controls, draw, "P41: earlier <think> blocks stripped by the template")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(stats: dict) -> dict:
    """Notebook 41's ``notebook_api.write_metrics`` keyword arguments (per-episode tensors stay out)."""
    reproduced, fixed = verdict(stats)
    return {
        "notebook": "41_think_stripping_template", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(stats),
        "metrics": {k: v for k, v in stats.items() if not isinstance(v, torch.Tensor)},
        "headline": {"what": "mean |log-prob error| of turn 2 after the re-rendered history", "unit": "nats",
                     "bug": stats["mean_abs_error_turn2_bug"], "fix": stats["mean_abs_error_turn2_fix"]},
    }
