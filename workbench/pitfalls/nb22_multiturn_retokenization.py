"""Pitfall P22: decode → re-encode between turns is not the identity for BPE.

A multi-turn rollout (tool calls, a second user message) samples turn 1 as token ids, decodes them
to text, appends the text to the conversation as an assistant message and re-renders the whole
conversation through the chat template before sampling turn 2 (TRL's GRPO tool loop before #5242,
TRL #5224). BPE is not a bijection: the sampler may have produced ``"he" "llo"`` where the
tokenizer encodes ``"hello"``, and the template's boundaries can merge differently. So the tokens
the trainer scores, y', are not the tokens that were sampled, y, although they spell the same text:

    log ρ_turn = Σ log π_θ(y' | x) − Σ log π_rollout(y | x) ≠ 0 at learning rate 0,

and the sequence KL estimate spikes on exactly those episodes. The fix: token-in / token-out —
the next prompt is ``prompt_ids + sampled_ids + suffix_ids`` (only the new turn's text is
encoded), never a re-encoding of text that was sampled.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.batching import pad_sequences
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements -------------------------------------------------------------------------------
def render_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


SENTINEL = "Zq7"


def turn_suffix_ids(tokenizer, user_message: str, turn_end_id: int) -> list[int]:
    """Ids the template writes after an assistant turn's end token up to the next generation prompt
    (``"\\n<|im_start|>user\\n…<|im_end|>\\n<|im_start|>assistant\\n"`` in ChatML), encoded alone."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SENTINEL},
                {"role": "user", "content": user_message}]
    tail = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True).split(SENTINEL, 1)[1]
    turn_end = tokenizer.convert_ids_to_tokens(turn_end_id)
    if not tail.startswith(turn_end):
        raise ValueError(f"the template does not end an assistant turn with {turn_end!r}")
    return tokenizer(tail[len(turn_end) :], add_special_tokens=False)["input_ids"]


def template_turn_end_id(tokenizer) -> int:
    """The special token id the chat template writes after an assistant message."""
    from workbench.modeling.stop_ids import template_turn_end

    return template_turn_end(tokenizer)


@torch.no_grad()
def two_turn_episodes(model, tokenizer, first: list[str], second: str, *, turn_end_id: int, max_new_tokens: int = 24,
                      seed: int = 0) -> list[dict]:
    """Sample turn 1 for each ``first`` user message; build the turn-2 prompt both ways.

    Each episode: ``prompt`` (turn-1 prompt ids), ``sampled`` (turn-1 content ids, turn end
    excluded), ``text`` (their decoding), ``retokenized`` (the content ids inside the re-rendered
    conversation), ``next_prompt_bug`` (re-rendered from text) and ``next_prompt_fix`` (ids
    concatenated)."""
    prompts = [render_ids(tokenizer, [{"role": "user", "content": m}], add_generation_prompt=True) for m in first]
    pad = tokenizer.pad_token_id
    ids, mask = pad_sequences(prompts, pad, side="left")
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=turn_end_id, pad_token_id=pad,
                     generator=torch.Generator().manual_seed(seed))
    suffix = turn_suffix_ids(tokenizer, second, turn_end_id)
    episodes = []
    for message, prompt, row, keep, done in zip(first, prompts, rollout.response_ids, rollout.response_mask, rollout.finished,
                                                strict=True):
        if not bool(done):
            continue  # a truncated turn has no turn end to continue after
        content = row[keep.bool()].tolist()[:-1]
        text = tokenizer.decode(content)
        history = [{"role": "user", "content": message}, {"role": "assistant", "content": text}]
        full = render_ids(tokenizer, history, add_generation_prompt=False)
        end = full.index(turn_end_id, len(prompt)) if full[: len(prompt)] == prompt else len(prompt)
        episodes.append({
            "prompt": prompt, "sampled": content, "text": text,
            "retokenized": full[len(prompt) : end] if full[: len(prompt)] == prompt else full,
            "next_prompt_bug": render_ids(tokenizer, history + [{"role": "user", "content": second}], add_generation_prompt=True),
            "next_prompt_fix": prompt + content + [turn_end_id] + suffix,
        })
    return episodes


@torch.no_grad()
def span_logprob(model, prompts: list[list[int]], spans: list[list[int]], pad_token_id: int) -> torch.Tensor:
    """Σ log π(span | prompt) per episode (teacher-forced, fp32 scoring of the model as it is)."""
    p_ids, p_mask = pad_sequences(prompts, pad_token_id, side="left")
    s_ids, s_mask = pad_sequences([s if s else [pad_token_id] for s in spans], pad_token_id, side="right")
    s_mask = s_mask * torch.tensor([[1] if s else [0] for s in spans])
    logp = response_logprobs(model, p_ids, p_mask, s_ids, s_mask).float()
    return (logp * s_mask).sum(-1)


def turn_log_ratios(model, episodes: list[dict], pad_token_id: int) -> dict:
    """Per episode: the log-ratio of turn 1 at lr 0 when the trainer scores the re-tokenized span
    (bug) or the sampled ids (fix) against the sampler's log-probability of what it sampled."""
    prompts = [e["prompt"] for e in episodes]
    sampled = span_logprob(model, prompts, [e["sampled"] for e in episodes], pad_token_id)
    retokenized = span_logprob(model, prompts, [e["retokenized"] for e in episodes], pad_token_id)
    changed = torch.tensor([e["retokenized"] != e["sampled"] for e in episodes])
    next_prompt_differs = torch.tensor([e["next_prompt_bug"] != e["next_prompt_fix"] for e in episodes])
    bug, fix = retokenized - sampled, sampled - sampled
    return {
        "episodes": len(episodes),
        "changed_fraction": float(changed.float().mean()),
        "next_prompt_differs_fraction": float(next_prompt_differs.float().mean()),
        "length_change": [len(e["retokenized"]) - len(e["sampled"]) for e in episodes],
        "log_ratio_bug": bug, "log_ratio_fix": fix,
        "max_abs_log_ratio_bug": float(bug.abs().max()), "max_abs_log_ratio_fix": float(fix.abs().max()),
        "mean_abs_log_ratio_bug": float(bug.abs().mean()), "mean_abs_log_ratio_fix": float(fix.abs().mean()),
        "examples": [(e["text"], e["sampled"], e["retokenized"]) for e, c in zip(episodes, changed, strict=True) if c][:3],
    }


def roundtrip_changes(tokenizer, ids: list[int]) -> bool:
    """Whether decode → encode returns other ids than ``ids`` (BPE: often, for sampled ids)."""
    return tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] != ids


def letter_roundtrip(tokenizer, word: str = "river") -> dict:
    """``word`` sampled one character token at a time, decoded and encoded again (BPE merges the letters):
    ``{"word", "sampled", "text", "encoded", "changed"}``."""
    sampled = [tokenizer.convert_tokens_to_ids(c) for c in word]
    text = tokenizer.decode(sampled)
    encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
    return {"word": word, "sampled": sampled, "text": text, "encoded": encoded, "changed": encoded != sampled}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(stats: dict, *, signature: float = 0.1, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: some episodes' trained tokens differ from the sampled ones with a
    turn log-ratio beyond ``signature`` nats; with concatenated ids none moves."""
    reproduced = stats["changed_fraction"] > 0 and stats["max_abs_log_ratio_bug"] > signature
    return reproduced, stats["max_abs_log_ratio_fix"] <= tolerance


NO_TEMPLATE = "this checkpoint has no chat template; the multi-turn episodes it samples are laid out by the chat template"


def no_episode_reason(max_new_tokens: int) -> str:
    """Why a sample of two-turn episodes left nothing to measure (no turn 1 ended), and the remedy."""
    return (f"no episode ended its first turn within max_new_tokens={max_new_tokens}: use a chat-tuned checkpoint "
            "(e.g. realistic-qwen2-chat) or raise max_new_tokens")


def not_shown(stats: dict, n_episodes: int, max_new_tokens: int) -> str | None:
    """Why the sample could not show the bug (``None`` when ``verdict`` reproduced it): too few finished
    turns, or none whose tokens changed in the decode → encode round trip."""
    if verdict(stats)[0]:
        return None
    return (f"{stats['episodes']} of {n_episodes} episodes ended their first turn within max_new_tokens={max_new_tokens} "
            f"and the round trip changed the tokens of {stats['changed_fraction']:.0%} of them, with |log ρ| ≤ "
            f"{stats['max_abs_log_ratio_bug']:.2g} nats: use a chat-tuned checkpoint (e.g. realistic-qwen2-chat) or raise "
            "n_episodes / max_new_tokens")


# ---- figures ------------------------------------------------------------------------------------
def plot_turn_log_ratio(ax, stats: dict, highlight: int | None = None) -> None:
    """Turn-1 log ρ at lr 0 per episode: re-encoded from text (bug, bars) vs sampled ids carried over (fix, squares)."""
    x = range(stats["episodes"])
    bars = ax.bar(x, stats["log_ratio_bug"].numpy(), color=plots.BUG_COLOR, label="re-encoded from text (bug)")
    ax.plot(x, stats["log_ratio_fix"].numpy(), "s", ms=3, color=plots.FIX_COLOR, label="sampled ids carried over (fix)")
    ax.set(xlabel="episode", ylabel="turn-1 log ρ at lr 0 (nats)")
    low, high = ax.get_ylim()  # bars stick to 0: add a margin so the fix's squares at 0 clear the axes edge
    span = max(high - low, 1e-9)
    ax.set_ylim(low - 0.06 * span, high + 0.14 * span)
    if highlight is not None:  # the selected episode: a black outline and a marker over its bar
        bars[highlight].set_edgecolor("black")
        bars[highlight].set_linewidth(2.5)
        top = max(float(stats["log_ratio_bug"][highlight]), 0.0)
        ax.plot([highlight], [top + 0.07 * span], "v", ms=7, color="black")
    plots.integer_axis(ax.xaxis)
    plots.legend_outside(ax, ncol=2)


def figure_turn_log_ratio(stats: dict):
    """The notebook's figure: ``plot_turn_log_ratio`` of every episode."""
    return plots.figure_panels((9, 3.6), lambda ax: plot_turn_log_ratio(ax, stats))


# ---- printers -----------------------------------------------------------------------------------
def roundtrip_line(roundtrip: dict) -> str:
    """A ``letter_roundtrip``: the letters' ids, decoded, encoded again — and whether the ids changed."""
    return (f"{roundtrip['word']!r} sampled letter by letter {roundtrip['sampled']} → decode {roundtrip['text']!r} → encode "
            f"{roundtrip['encoded']}; changed: {roundtrip['changed']}")


def stats_lines(stats: dict, tokenizer) -> str:
    """How many turns changed, the log-ratios with bug and fix, and up to three changed turns token by token."""
    lines = [f"{stats['episodes']} finished episodes; turn-1 tokens changed by the round trip in {stats['changed_fraction']:.0%}, "
             f"turn-2 prompt differs in {stats['next_prompt_differs_fraction']:.0%}",
             f"|log ρ| of turn 1: max {stats['max_abs_log_ratio_bug']:.2f} nats, mean {stats['mean_abs_log_ratio_bug']:.3f} (bug); "
             f"max {stats['max_abs_log_ratio_fix']:.2f} (fix)"]
    lines += [f"{text!r}: sampled {tokenizer.convert_ids_to_tokens(sampled)} → trained {tokenizer.convert_ids_to_tokens(again)}"
              for text, sampled, again in stats["examples"]]
    return "\n".join(lines)


# ---- explorer -----------------------------------------------------------------------------------
def episode_explorer(episodes: list[dict], stats: dict, tokenizer) -> Explorer:
    """P22: one episode's turn 1 — the sampled tokens, the tokens the trainer scores after decode → encode, its log ρ."""

    def draw(episode):
        e = episodes[episode]
        fig, ax = plt.subplots(figsize=(9, 3.2))
        plot_turn_log_ratio(ax, stats, highlight=episode)
        ax.set_title(f"{e['text']!r}: sampled {tokenizer.convert_ids_to_tokens(e['sampled'])}\n"
                     f"→ trained {tokenizer.convert_ids_to_tokens(e['retokenized'])}", fontsize=8)
        return {"episode": episode, "changed": e["retokenized"] != e["sampled"],
                "log_ratio_bug": float(stats["log_ratio_bug"][episode]), "log_ratio_fix": float(stats["log_ratio_fix"][episode])}

    changed = [i for i, e in enumerate(episodes) if e["retokenized"] != e["sampled"]]
    slider = widgets.IntSlider(value=changed[0] if changed else 0, min=0, max=len(episodes) - 1, description="episode")
    return Explorer({"episode": slider}, draw, "P22: a turn re-encoded from its text")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(stats: dict, *, n_episodes: int, max_new_tokens: int) -> dict:
    """Notebook 22's ``notebook_api.write_metrics`` keyword arguments (the per-episode tensors and examples stay out)."""
    reproduced, fixed = verdict(stats)
    return {
        "notebook": "22_multiturn_retokenization", "reproduced": reproduced, "fixed": fixed,
        "not_shown": not_shown(stats, n_episodes, max_new_tokens),
        "metrics": {k: v for k, v in stats.items() if k not in ("log_ratio_bug", "log_ratio_fix", "examples")},
        "headline": {"what": "max |log ρ| of a turn-1 response at lr 0", "unit": "nats",
                     "bug": stats["max_abs_log_ratio_bug"], "fix": stats["max_abs_log_ratio_fix"]},
    }
