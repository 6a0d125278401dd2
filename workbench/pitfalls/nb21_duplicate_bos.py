"""Pitfall P21: two BOS tokens — a chat template that writes BOS, and a tokenizer that adds one.

Llama-3-style chat templates start with ``{{ bos_token }}`` and their tokenizers' post-processor
also prepends BOS. ``apply_chat_template(tokenize=True)`` encodes without special tokens, so its
ids start with one BOS; but the common two-step path — render the text with
``apply_chat_template(tokenize=False)``, then ``tokenizer(text)`` — adds a second one. A policy
trained on one BOS then sees a sequence shifted by one position behind an unexpected token:
log π(response | BOS BOS prompt) ≠ log π(response | BOS prompt). When the rollout engine got one
path and the trainer the other, the importance ratio is not 1 at learning rate 0 and the KL to a
reference scored the other way is not 0 (DeepSeek-R1 #151, NeMo-RL #855).

The fix: encode rendered chat text with ``add_special_tokens=False`` (or pass the template's ids
along), and assert that a sequence starts with exactly one BOS.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.batching import pad_sequences
from workbench.modeling import models, realistic
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer

ENCODINGS = ("template ids", "text + tokenizer()", "text + tokenizer(add_special_tokens=False)")
BUG_PATH, FIX_PATH = ENCODINGS[1], ENCODINGS[2]


# ---- measurements -------------------------------------------------------------------------------
def encode_chat(tokenizer, messages: list[dict], how: str) -> list[int]:
    """Prompt ids (with the generation prompt) by one of the three usual paths in ``ENCODINGS``."""
    if how not in ENCODINGS:
        raise ValueError(f"how={how!r}; use one of {ENCODINGS}")
    if how == "template ids":
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=how == "text + tokenizer()")["input_ids"]


def leading_bos(ids: list[int], bos_token_id: int | None) -> int:
    """How many BOS tokens a sequence starts with."""
    count = 0
    while bos_token_id is not None and count < len(ids) and ids[count] == bos_token_id:
        count += 1
    return count


def strip_duplicate_bos(ids: list[int], bos_token_id: int | None) -> list[int]:
    """The guard: keep exactly one leading BOS where there are several."""
    extra = leading_bos(ids, bos_token_id) - 1
    return ids[extra:] if extra > 0 else ids


def bos_audit(tokenizer) -> dict:
    """What a tokenizer and its chat template do about BOS, and the leading-BOS count of each path."""
    bos = tokenizer.bos_token_id
    messages = [{"role": "user", "content": "1+1="}]
    adds_bos = bos is not None and leading_bos(tokenizer("x")["input_ids"], bos) > 0
    audit = {"bos_token": tokenizer.bos_token, "tokenizer_adds_bos": adds_bos,
             "has_chat_template": bool(getattr(tokenizer, "chat_template", None))}
    if audit["has_chat_template"]:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        audit["template_writes_bos"] = tokenizer.bos_token is not None and text.startswith(tokenizer.bos_token)
        audit["leading_bos"] = {how: leading_bos(encode_chat(tokenizer, messages, how), bos) for how in ENCODINGS}
    return audit


def filler_id(tokenizer, avoid: list[int]) -> int:
    """A token id to fill padded positions (always masked) when the tokenizer has no pad token."""
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    for token_id in sorted(tokenizer.added_tokens_decoder):
        if token_id not in avoid:
            return token_id
    raise ValueError("the tokenizer has no pad token and no spare special token to pad with; set tokenizer.pad_token")


@torch.no_grad()
def response_shift(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 12, seed: int = 0,
                   greedy: bool = False) -> dict:
    """Responses sampled from single-BOS prompts (the template's ids, as a rollout engine gets them),
    then scored behind the prompt as each path encodes it: per-token log-ratios to the template-ids
    score at lr 0, and the k1 KL estimate per sequence."""
    stop = model.generation_config.eos_token_id
    stop = [stop] if isinstance(stop, int) else list(stop)
    pad = filler_id(tokenizer, avoid=stop + [tokenizer.bos_token_id])
    prompts_by = {how: [encode_chat(tokenizer, [{"role": "user", "content": p}], how) for p in prompts] for how in ENCODINGS}
    device = model.device
    ids, mask = (t.to(device) for t in pad_sequences(prompts_by["template ids"], pad, side="left"))
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad,
                     generator=torch.Generator(device).manual_seed(seed), greedy=greedy)
    real = rollout.response_mask.bool()
    # π_old as the engine saw it: the same responses behind the template's own ids (teacher-forced).
    reference = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask).float()
    result = {"texts": [tokenizer.decode(row[keep]) for row, keep in zip(rollout.response_ids, real, strict=True)], "paths": {}}
    for how, rows in prompts_by.items():
        p_ids, p_mask = (t.to(device) for t in pad_sequences(rows, pad, side="left"))
        logp = response_logprobs(model, p_ids, p_mask, rollout.response_ids, rollout.response_mask).float()
        log_ratio = (logp - reference)[real]
        result["paths"][how] = {
            "leading_bos": leading_bos(rows[0], tokenizer.bos_token_id),
            "mean_abs_log_ratio": float(log_ratio.abs().mean()),
            "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
            "sequence_kl_k1": float(-(logp - reference).mul(rollout.response_mask).sum(-1).mean()) + 0.0,  # no "-0.0"
            "log_ratio": log_ratio.cpu(),
        }
    # the guard: stripping the extra BOS recovers the template's ids exactly
    guarded = [strip_duplicate_bos(r, tokenizer.bos_token_id) for r in prompts_by["text + tokenizer()"]]
    result["guard_recovers_template_ids"] = guarded == prompts_by["template ids"]
    return result


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[str], how: str, *, max_new_tokens: int = 8) -> list[str]:
    """Greedy responses (decoded, special tokens dropped) to ``prompts`` encoded by path ``how``."""
    stop = model.generation_config.eos_token_id
    stop = [stop] if isinstance(stop, int) else list(stop)
    pad = filler_id(tokenizer, avoid=stop + [tokenizer.bos_token_id])
    rows = [encode_chat(tokenizer, [{"role": "user", "content": p}], how) for p in prompts]
    ids, mask = (t.to(model.device) for t in pad_sequences(rows, pad, side="left"))
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=stop, pad_token_id=pad, greedy=True)
    return [tokenizer.decode(r[k.bool()], skip_special_tokens=True)
            for r, k in zip(rollout.response_ids, rollout.response_mask, strict=True)]


def greedy_comparison(model, tokenizer, prompts: list[str]) -> dict:
    """Greedy answers behind one BOS (template ids) and two (text + tokenizer()), and the share that changes."""
    answers = {how: greedy_answers(model, tokenizer, prompts, how) for how in ("template ids", BUG_PATH)}
    changed = sum(a != b for a, b in zip(*answers.values(), strict=True)) / len(prompts)
    return {"prompts": prompts, "answers": answers, "changed_fraction": changed}


# ---- verdict ------------------------------------------------------------------------------------
def not_shown(tokenizer) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: a tokenizer without a BOS token (Qwen2)
    cannot put two in front of a prompt."""
    if tokenizer.bos_token_id is not None:
        return None
    return "the tokenizer has no BOS token (Qwen2-style), so no prompt can start with two; a Llama-3-like checkpoint shows it"


def verdict(bug: dict, fix: dict, *, signature: float = 1e-3, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """``(reproduced, fixed)`` from two ``response_shift`` path summaries: the bug path starts with
    two BOS and moves the log-probs; the fix path starts with one and moves nothing."""
    reproduced = bug["leading_bos"] >= 2 and bug["mean_abs_log_ratio"] > signature
    fixed = fix["leading_bos"] == 1 and fix["max_ratio_deviation"] <= tolerance
    return reproduced, fixed


# ---- figures ------------------------------------------------------------------------------------
def plot_log_ratio(ax, shift: dict, how: str = BUG_PATH) -> None:
    """Histogram of the per-token log-ratios of path ``how`` (``response_shift``) against the fix path's line at 0."""
    path, fix = shift["paths"][how], shift["paths"][FIX_PATH]
    color = plots.BUG_COLOR if how == BUG_PATH else plots.SERIES_COLORS[0]  # the fix path is the line at 0
    tag = " (bug)" if how == BUG_PATH else ""
    ax.hist(path["log_ratio"].numpy(), bins=40, color=color, alpha=0.8, label=f"{how}: {path['leading_bos']} BOS{tag}")
    largest = float(fix["log_ratio"].abs().max()) if fix["log_ratio"].numel() else 0.0
    ax.axvline(0, color=plots.FIX_COLOR, lw=3, label=f"add_special_tokens=False: {fix['leading_bos']} BOS, "
               + ("all exactly 0" if largest == 0 else f"all within {largest:.0e} of 0") + " (fix)")
    ax.set(xlabel="log ρ per response token at lr 0", ylabel="response tokens")
    plots.legend_outside(ax)


def figure_log_ratio(shift: dict):
    """The notebook's figure: ``plot_log_ratio`` of the two-BOS path."""
    return plots.figure_panels((7, 3.6), lambda ax: plot_log_ratio(ax, shift))


# ---- printers -----------------------------------------------------------------------------------
def caption_note() -> str:
    """The caption under the figure: what log ρ compares."""
    return ("log ρ = log π(token | the trainer's ids) − log π(token | the template's ids) for every response token, at "
            "learning rate 0: the histogram is the path with two BOS (bug), the line at 0 the path with "
            "add_special_tokens=False (fix).")


def bos_audit_lines() -> str:
    """``bos_audit`` of every realistic checkpoint flavour's tokenizer, one line each."""
    return "\n".join(f"{flavour:10s} {bos_audit(models.load_tokenizer(realistic.checkpoint(flavour)))}"
                     for flavour in realistic.FLAVOURS)


def encoding_lines(tokenizer, content: str = "2+2=") -> str:
    """The first four tokens of a one-message chat under each encoding path."""
    return "\n".join(f"{how:45s} {tokenizer.convert_ids_to_tokens(encode_chat(tokenizer, [{'role': 'user', 'content': content}], how))[:4]}"
                     for how in ENCODINGS)


def shift_lines(shift: dict) -> str:
    lines = [f"{how:45s} {r['leading_bos']} BOS: mean |log ρ| {r['mean_abs_log_ratio']:.3f}, max |ρ−1| {r['max_ratio_deviation']:.3f}, "
             f"k1 KL per sequence {r['sequence_kl_k1']:+.4f}" for how, r in shift["paths"].items()]
    return "\n".join(lines + [f"stripping the extra BOS recovers the template's ids: {shift['guard_recovers_template_ids']}"])


def greedy_lines(greedy: dict, shown: int = 4) -> str:
    """The changed share, then up to ``shown`` examples: the changed ones, unchanged only when none changed."""
    prompts = greedy["prompts"]
    lines = [f"greedy responses that change when the prompt starts with two BOS: {greedy['changed_fraction']:.1%} of {len(prompts)}"]
    pairs = list(zip(prompts, *greedy["answers"].values(), strict=True))
    changed = [p for p in pairs if p[1] != p[2]]
    lines.append(f"{'changed' if changed else 'unchanged (none changed)'} examples:")
    lines += [f"{prompt!r:10s} one BOS → {one!r:8s} two BOS → {two!r}" for prompt, one, two in (changed or pairs)[:shown]]
    return "\n".join(lines)


# ---- explorer -----------------------------------------------------------------------------------
def log_ratio_explorer(shift: dict) -> Explorer:
    """A dropdown over the encoding paths: the chosen path's log-ratio histogram, redrawn from ``response_shift``'s result."""

    def draw(how):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        plot_log_ratio(ax, shift, how)
        return {k: v for k, v in shift["paths"][how].items() if k != "log_ratio"}

    dropdown = widgets.Dropdown(options=list(shift["paths"]), value=BUG_PATH, description="encoding")
    return Explorer({"how": dropdown}, draw, title="P21: per-token log-ratio at lr 0 behind each encoding of the prompt")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(shift: dict, greedy: dict, tokenizer) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 21: fixed needs the guard to recover the template's ids."""
    bug, fix = shift["paths"][BUG_PATH], shift["paths"][FIX_PATH]
    reproduced, fixed = verdict(bug, fix)
    return dict(
        notebook="21_duplicate_bos", not_shown=not_shown(tokenizer),
        reproduced=reproduced, fixed=fixed and shift["guard_recovers_template_ids"],
        metrics={"paths": {h: {k: v for k, v in r.items() if k != "log_ratio"} for h, r in shift["paths"].items()},
                 "greedy_changed_fraction": greedy["changed_fraction"],
                 "guard_recovers_template_ids": shift["guard_recovers_template_ids"]},
        headline={"what": "mean |log ρ| per response token at lr 0 (trainer's ids vs template ids)", "unit": "nats",
                  "bug": bug["mean_abs_log_ratio"], "fix": fix["mean_abs_log_ratio"]},
    )
