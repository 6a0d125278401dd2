"""Pitfall P29: a prefix (KV) cache reused across a weight update.

Rollout engines cache the keys and values of prompt prefixes and key the cache by token content (vLLM's automatic prefix
caching, SGLang's radix cache): GRPO's group of samples per prompt, a shared system prompt and a prompt seen again next
epoch all skip their prefill. The cached keys and values were computed by the weights that first filled the block. After
the trainer pushes new weights, a prompt served from the cache is decoded by the new weights on top of the old weights'
prefix: the engine's log-probs μ belong to neither policy, while the trainer scores the same tokens fresh with the new
weights. The rollout/trainer log-prob gap on repeated prompts grows with every update since the block was filled; on new
prompts it stays at rounding level (vLLM #9744, Oct 2024: "the cached prefix won't be updated after load_weights"; vLLM
0.7.0 added ``reset_prefix_cache``; ms-swift PR #3640 resets it after each GRPO weight sync; NeMo-RL PR #4018: async
GRPO left the prefix cache untouched across 17 refits, and the mismatch grew step over step until an engine restart).

The fix: invalidate the prefix cache whenever the weights change (``reset_prefix_cache()`` after every weight sync).

This module builds a small engine on the tiny model: a content-keyed cache of each prompt's keys and values (all prompt
tokens but the last, which an engine always recomputes, as vLLM does on a full hit), decoding with the current weights
on top. It fills the cache, trains the policy for k REINFORCE updates, and serves the same prompts again with each cache
policy, plus prompts it never saw; the trainer rescores every sample with a fresh forward.
"""

from __future__ import annotations

import copy

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.core.devices import generator_on, model_device
from workbench.core.losses import outside_clip_window
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import decode_responses, encode_prompts, reward
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars

CACHE_POLICIES = ("invalidate", "keep")  # the fix, the bug: what the engine does with its prefix cache on a weight update


# ---- measurements --------------------------------------------------------------------------------
class PrefixCache:
    """Prompt token ids → (the keys and values of all prompt tokens but the last, the weight version that computed them)."""

    def __init__(self, policy: str):
        if policy not in CACHE_POLICIES:
            raise ValueError(f"cache policy {policy!r}; use one of {CACHE_POLICIES} ('invalidate' is the fix)")
        self.policy, self.entries = policy, {}

    @torch.no_grad()
    def lookup(self, model, prompt_ids: torch.Tensor, version: int):
        """A private copy of the prompt's cached keys/values (filled now on a miss), the version that filled it, and hit."""
        key = tuple(prompt_ids[0].tolist())
        hit = key in self.entries
        if not hit:
            self.entries[key] = (model(prompt_ids[:, :-1], use_cache=True).past_key_values, version)
        kv, filled_at = self.entries[key]
        return copy.deepcopy(kv), filled_at, hit  # decoding appends to a cache: never to the shared entry

    def on_weight_update(self) -> None:
        """What the engine does when new weights arrive: drop every entry (fix) or nothing (bug)."""
        if self.policy == "invalidate":
            self.entries.clear()


@torch.no_grad()
def engine_sample(model, cache: PrefixCache, prompt_ids: torch.Tensor, *, version: int, group_size: int, max_new_tokens: int,
                  eos_token_id: int, pad_token_id: int, generator: torch.Generator) -> dict:
    """``group_size`` responses to one prompt (1, P) decoded on the cached prefix; the engine's log-probs μ per token."""
    device = model_device(model)  # see workbench.core.devices
    prompt_ids, generator = prompt_ids.to(device), generator_on(generator, device)
    kv, filled_at, hit = cache.lookup(model, prompt_ids, version)
    kv.batch_repeat_interleave(group_size)
    length = prompt_ids.shape[1]
    token = prompt_ids[:, -1:].repeat(group_size, 1)  # the last prompt token is always recomputed by the current weights
    tokens, logps, done = [], [], torch.zeros(group_size, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        position = torch.full((group_size, 1), length - 1 + step, device=device)
        attention = torch.ones(group_size, length + step, dtype=torch.long, device=device)
        out = model(token, past_key_values=kv, position_ids=position, attention_mask=attention)
        logprobs = torch.log_softmax(out.logits[:, -1].float(), -1)
        drawn = torch.multinomial(logprobs.exp(), 1, generator=generator)
        drawn = torch.where(done.unsqueeze(-1), torch.full_like(drawn, pad_token_id), drawn)
        tokens.append(drawn)
        logps.append(logprobs.gather(-1, drawn).squeeze(-1))
        done = done | (drawn.squeeze(-1) == eos_token_id)
        token = drawn
        if done.all():
            break
    response = torch.cat(tokens, 1)
    is_eos = (response == eos_token_id).long()
    mask = ((is_eos.cumsum(-1) - is_eos) == 0).long()  # every token up to and including the first EOS
    return {"prompt_ids": prompt_ids.repeat(group_size, 1).cpu(), "response_ids": torch.where(mask.bool(), response, pad_token_id).cpu(),
            "response_mask": mask.cpu(), "engine_logprobs": (torch.stack(logps, 1) * mask).cpu(), "hit": hit,
            "kv_age": version - filled_at}


def serve_and_score(model, tokenizer, cache: PrefixCache, problems, *, version: int, group_size: int, max_new_tokens: int,
                    seed: int) -> dict:
    """Serve each problem through the engine, rescore every response fresh with the same weights (the trainer's forward);
    per-token |log μ − log π| and log π − log μ, the cache hits and the age of the keys/values used."""
    gaps, log_ratios, hits, ages = [], [], 0, []
    generator = torch.Generator().manual_seed(seed)
    for problem in problems:
        ids, _ = encode_prompts(tokenizer, [problem.prompt])
        served = engine_sample(model, cache, ids, version=version, group_size=group_size, max_new_tokens=max_new_tokens,
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, generator=generator)
        with torch.no_grad():
            trainer = response_logprobs(model, served["prompt_ids"], torch.ones_like(served["prompt_ids"]), served["response_ids"],
                                        served["response_mask"])
        m = served["response_mask"].bool()
        log_ratios.append((trainer - served["engine_logprobs"])[m])
        gaps.append(log_ratios[-1].abs())
        hits += served["hit"]
        ages.append(served["kv_age"])
    gap = torch.cat(gaps)
    return {"mean_gap": float(gap.mean()), "max_gap": float(gap.max()), "log_ratio": torch.cat(log_ratios),
            "hit_rate": hits / len(problems), "kv_age": max(ages)}


def reinforce_step(model, optimizer, tokenizer, problems, *, seed: int, max_new_tokens: int) -> dict:
    """One policy-gradient update on fresh samples of ``problems``: loss = −mean((R − mean R) · Σ_t log π(y_t)).
    Returns how many responses it sampled and how many earned a reward (all rewards equal: no gradient)."""
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    r = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    texts = decode_responses(tokenizer, r.response_ids, r.response_mask)
    rewards = torch.tensor([reward(t, bool(f), p) for t, f, p in zip(texts, r.finished.tolist(), problems, strict=True)])
    logp = response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    loss = -((rewards - rewards.mean()) * (logp * r.response_mask).sum(-1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"responses": len(problems), "rewarded": int((rewards > 0).sum())}


@torch.no_grad()
def weight_change(model, original) -> float:
    """The largest |θ − θ₀| over every parameter of ``model`` against ``original`` (same architecture)."""
    return max((float((p - q).abs().max()) for p, q in zip(model.parameters(), original.parameters(), strict=True)), default=0.0)


# ---- sweeps --------------------------------------------------------------------------------------
def update_sweep(model, tokenizer, repeated, new_pool, train_problems, updates: list[int], *, lr: float = 1e-4,
                 clip: float = 0.2, group_size: int = 4, seed: int = 0, max_new_tokens: int = 6) -> list[dict]:
    """Fill both engines' caches with ``repeated`` at version 0, then take REINFORCE updates on ``train_problems``
    (one update per step, the engines told after each); at each count in ``updates`` serve ``repeated`` again and
    as many never-seen prompts from ``new_pool`` through each engine. One row per count: for each cache policy, the
    gap on repeated and on new prompts, hit rate, age of the cached keys/values, tokens outside the clip window; and how
    far the updates so far moved the weights (``weight_change``) and the rewards they trained on."""
    if len(new_pool) < len(repeated) * len(updates):
        raise ValueError(f"new_pool holds {len(new_pool)} prompts; serving {len(repeated)} new prompts at each of "
                         f"{len(updates)} update counts needs {len(repeated) * len(updates)} (pass more problems)")
    actor = copy.deepcopy(model).train(False)
    optimizer = torch.optim.Adam(actor.parameters(), lr=lr)
    caches = {policy: PrefixCache(policy) for policy in CACHE_POLICIES}
    serve = dict(group_size=group_size, max_new_tokens=max_new_tokens)
    # the work in rollouts of len(repeated) prompts: the first fill, one per update, two (repeated, new) per policy per count
    bar = progress.bar(len(caches) + max(updates) + 2 * len(caches) * len(updates), "fill, update, serve", unit="rollout")
    for cache in caches.values():  # the first rollout: fills each cache with version 0's keys and values
        serve_and_score(actor, tokenizer, cache, repeated, version=0, seed=seed, **serve)
        bar.update(1)
    rows, fresh, trained = [], iter(range(0, len(new_pool), len(repeated))), {"train_responses": 0, "train_rewarded": 0}
    for k in range(max(updates) + 1):
        if k > 0:
            step = reinforce_step(actor, optimizer, tokenizer, train_problems, seed=seed + 1000 + k, max_new_tokens=max_new_tokens)
            trained = {"train_responses": trained["train_responses"] + step["responses"],
                       "train_rewarded": trained["train_rewarded"] + step["rewarded"]}
            for cache in caches.values():
                cache.on_weight_update()
            bar.update(1)
        if k in updates:
            start = next(fresh)
            row = {"updates": k, "weight_change": weight_change(actor, model), **trained}
            for policy, cache in caches.items():
                again = serve_and_score(actor, tokenizer, cache, repeated, version=k, seed=seed + k, **serve)
                new = serve_and_score(actor, tokenizer, cache, new_pool[start:start + len(repeated)], version=k, seed=seed + k, **serve)
                row[policy] = {"repeated_gap": again["mean_gap"], "repeated_max_gap": again["max_gap"],
                               "repeated_hit_rate": again["hit_rate"], "kv_age": again["kv_age"],
                               "new_gap": new["mean_gap"], "new_max_gap": new["max_gap"],
                               "new_hit_rate": new["hit_rate"], "log_ratio": again["log_ratio"],
                               "outside_clip": outside_clip_window(again["log_ratio"], clip)}
                bar.update(2)
            rows.append(row)
    bar.close()
    return rows


def headline_row(rows: list[dict]) -> dict:
    """The ``update_sweep`` row after the most updates."""
    return max(rows, key=lambda r: r["updates"])


# ---- verdict -------------------------------------------------------------------------------------
def verdict(rows: list[dict], *, signature: float = 1e-3, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``update_sweep`` rows.

    Reproduced: keeping the cache, the repeated prompts' mean |log μ − log π| at the most updates exceeds ``signature``
    and the gap there exceeds the gap at the fewest, while the new prompts (cache misses) stay within ``tolerance``: the
    stale prefix is the cause. Fixed: invalidating on every update, every gap (max per token) is within ``tolerance``.
    """
    first, last = min(rows, key=lambda r: r["updates"]), headline_row(rows)
    keep = last["keep"]
    reproduced = (keep["repeated_gap"] > signature and keep["repeated_gap"] > first["keep"]["repeated_gap"]
                  and keep["new_max_gap"] <= tolerance)
    fixed = all(max(r["invalidate"]["repeated_max_gap"], r["invalidate"]["new_max_gap"]) <= tolerance for r in rows)
    return reproduced, fixed


def not_shown(rows: list[dict], last: dict) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None (shown, or a failed reproduction the numbers must explain).
    When the updates leave every weight as it was (a checkpoint that never earns the task's reward: R − mean R = 0, no
    gradient), the cached keys and values are the current weights' own: there is nothing stale to serve. ``last``: the
    ``headline_row``."""
    if verdict(rows)[0] or last["updates"] == 0 or last.get("weight_change", 1.0) > 0:
        return None
    why = ("none of them earned a reward, so R − mean R = 0 and there was no gradient" if last["train_rewarded"] == 0 else
           f"{last['train_rewarded']} of them earned a reward, in batches whose rewards were all equal (no gradient)")
    return (f"the {last['updates']} REINFORCE update(s) left this checkpoint's weights exactly as they were (max |Δθ| "
            f"{last['weight_change']:.1e}) — they trained on {last['train_responses']} sampled responses and {why} — so keys and "
            f"values cached before them are still the current ones (repeated-prompt gap with the cache kept "
            f"{last['keep']['repeated_gap']:.1e} nats per token): nothing stale to serve; use a checkpoint that solves some of "
            "the problems")


# ---- figures -------------------------------------------------------------------------------------
FLOOR = 1e-9  # where a log axis draws an exact 0
GAP_SERIES = (("keep", "repeated_gap", plots.BUG_COLOR, dict(marker="o", ms=9, mfc="none", mew=1.5, ls="-"),
               "repeated, cache kept (bug)"),
              ("invalidate", "repeated_gap", plots.FIX_COLOR, dict(marker="s", ms=4, ls="-"), "repeated, invalidated (fix)"))


def new_prompts_agree(rows: list[dict]) -> bool:
    """True when the never-seen prompts (cache misses under both policies) show the same gap whichever the policy."""
    return all(r["keep"]["new_gap"] == r["invalidate"]["new_gap"] for r in rows)


def plot_gap(ax, rows: list[dict]) -> None:
    """Mean |log μ − log π| per token against the updates since the cache was filled, on a log axis: repeated prompts
    under each cache policy (hollow circles for the bug, so the fix's squares show inside them where both agree, as at
    0 updates), new prompts in grey (one line when both policies measure the same on them)."""
    k = [r["updates"] for r in rows]
    for policy, key, color, style, label in GAP_SERIES:
        ax.plot(k, [max(r[policy][key], FLOOR) for r in rows], color=color, label=label, **style)
    news = [("keep", "new prompts")] if new_prompts_agree(rows) else [("keep", "new, cache kept"), ("invalidate", "new, invalidated")]
    for (policy, label), ls in zip(news, (":", "-."), strict=False):
        ax.plot(k, [max(r[policy]["new_gap"], FLOOR) for r in rows], ls=ls, marker="^", ms=4, color=plots.NEUTRAL_COLOR, label=label,
                zorder=3)  # dotted, over the fix's line: both stay visible where they meet at rounding level
    ax.set_yscale("log")
    if any(r[p][key] < FLOOR for r in rows for p in CACHE_POLICIES for key in ("repeated_gap", "new_gap")):
        plots.draw_floor(ax, FLOOR)
    ax.set_xticks(k)
    ax.set_xlabel("weight updates k")
    ax.set_ylabel("mean |log μ − log π|")
    ax.set_title("log-prob gap per token", fontsize=10)


def plot_clip(ax, rows: list[dict], clip: float) -> None:
    """Share of the repeated prompts' tokens whose ratio π_trainer / μ_engine lies outside the clip window."""
    x = list(range(len(rows)))
    fix = ax.bar([i - 0.2 for i in x], [r["invalidate"]["outside_clip"] for r in rows], 0.4, color=plots.FIX_COLOR)
    bug = ax.bar([i + 0.2 for i in x], [r["keep"]["outside_clip"] for r in rows], 0.4, color=plots.BUG_COLOR)
    label_zero_bars(ax, fix)
    label_zero_bars(ax, bug)
    ax.set_xticks(x, [str(r["updates"]) for r in rows])
    ax.set_xlabel("weight updates k")
    ax.set_ylabel(f"share with |ρ − 1| > {clip:g}")
    ax.set_ylim(0, 1.2 * max([r["keep"]["outside_clip"] for r in rows] + [0.05]))
    ax.set_title("outside the clip window", fontsize=10)


def plot_log_ratio(ax, row: dict, clip: float) -> None:
    """Histogram of log π_trainer − log μ_engine on the repeated prompts' tokens, both cache policies, and the clip window
    (dashed); values beyond ±1 are drawn at ±1."""
    series = [(row["keep"]["log_ratio"].numpy(), plots.BUG_COLOR, "cache kept (bug)"),
              (row["invalidate"]["log_ratio"].numpy(), plots.FIX_COLOR, "invalidated (fix)")]
    plots.plot_log_ratio_histogram(ax, series, clip, torch.linspace(-1.0, 1.0, 51).numpy(), "log π − log μ")
    ax.set_title(f"per token, k = {row['updates']}", fontsize=10)


def figure_stale_cache(rows: list[dict], last: dict, clip: float):
    """The notebook's figure: the gap vs updates, the clip-window share, the log-ratio histogram at the most updates
    (``last``: the ``headline_row``), one legend under the three panels (``stale_cache_note`` says the rest)."""
    fig = plots.figure_panels((plots.NOTEBOOK_WIDTH, 3.0), lambda ax: plot_gap(ax, rows), lambda ax: plot_clip(ax, rows, clip),
                              lambda ax: plot_log_ratio(ax, last, clip))
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=9)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def sweep_lines(rows: list[dict], clip: float) -> str:
    lines = []
    for r in rows:
        for policy in CACHE_POLICIES:
            s = r[policy]
            lines.append(f"{r['updates']} updates, cache {'kept' if policy == 'keep' else 'invalidated'}: repeated prompts "
                         f"(hits {s['repeated_hit_rate']:.0%}, keys/values {s['kv_age']} updates old) |Δ log p| mean "
                         f"{s['repeated_gap']:.2e}, max {s['repeated_max_gap']:.2e}, {s['outside_clip']:.1%} outside ε = {clip:g}; "
                         f"new prompts (hits {s['new_hit_rate']:.0%}) mean {s['new_gap']:.2e}, max {s['new_max_gap']:.2e}")
    return "\n".join(lines)


def stale_cache_note(rows: list[dict], last: dict, clip: float) -> str:
    """The caption printed under ``figure_stale_cache``: what each panel draws, in words the labels leave out."""
    first = min(rows, key=lambda r: r["updates"])
    fresh = (" At k = 0 the kept cache is the current weights' own, so the bug's hollow circle rings the fix's square."
             if first["updates"] == 0 and first["keep"]["repeated_gap"] == first["invalidate"]["repeated_gap"] else "")
    new = ("New prompts miss the cache under both policies and measure the same: one grey line." if new_prompts_agree(rows)
           else "New prompts miss the cache under both policies: grey, dotted when kept, dash-dotted when invalidated.")
    return (f"Left: mean |log μ_engine − log π_trainer| per token against the weight updates k since the prefix cache was "
            f"filled (log axis).{fresh} {new} Middle: share of the repeated prompts' tokens whose ratio π / μ lies outside "
            f"[1 − ε, 1 + ε], ε = {clip:g}. Right: log π − log μ per repeated-prompt token after k = {last['updates']} updates, "
            f"clamped to ±1 (tokens beyond it drawn at ±1); dashed: the clip window.")


def headline_sentence(rows: list[dict], last: dict, clip: float) -> str:
    """The gaps after the most updates (``last``: the ``headline_row``), and the verdict's reading."""
    reproduced, fixed = verdict(rows)
    keep, inv = last["keep"], last["invalidate"]
    if not reproduced:
        return (f"after {last['updates']} updates the repeated prompts' gap is {keep['repeated_gap']:.1e} nats per token (threshold "
                f"1e-3) or the new prompts' is not at rounding level: raise the learning rate or the number of updates")
    return (f"after {last['updates']} weight updates the repeated prompts, served on keys/values {keep['kv_age']} updates old, "
            f"differ from the trainer by {keep['repeated_gap']:.3f} nats per token ({keep['outside_clip']:.1%} of tokens outside "
            f"the ε = {clip:g} window) while new prompts differ by {keep['new_gap']:.1e}"
            + (f"; invalidating the cache on every update brings the repeated prompts to {inv['repeated_gap']:.1e}." if fixed
               else "; invalidating did not bring the gap to rounding level (check the engine's dtype)."))


# ---- explorer ------------------------------------------------------------------------------------
def stale_cache_explorer(rows: list[dict], clip: float = 0.2) -> Explorer:
    """Sliders for the number of updates and ε: the repeated prompts' log-ratio histogram, redrawn."""

    def draw(updates, epsilon):
        row = next(r for r in rows if r["updates"] == updates)
        fig, ax = plt.subplots(figsize=(6.5, 3.2))
        plot_log_ratio(ax, row, epsilon)
        share = {p: outside_clip_window(row[p]["log_ratio"], epsilon) for p in CACHE_POLICIES}
        ax.legend(**plots.LEGEND_RIGHT)
        ax.set_title(f"k = {updates}: outside ε, kept {share['keep']:.1%}, invalidated {share['invalidate']:.1%}", fontsize=9)
        return {"updates": updates, **{f"outside_clip_{p}": v for p, v in share.items()}}

    counts = [r["updates"] for r in rows]
    controls = {"updates": widgets.SelectionSlider(options=counts, value=max(counts), description="updates k"),
                "epsilon": widgets.FloatSlider(value=clip, min=0.01, max=0.5, step=0.01, description="ε")}
    return Explorer(controls, draw, title="P29: a prefix cache filled before k weight updates")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], last: dict, clip: float) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 29 (``last``: the ``headline_row``)."""
    reproduced, fixed = verdict(rows)
    moved = ("weight_change", "train_responses", "train_rewarded")
    plain = [{"updates": r["updates"], **{k: r[k] for k in moved if k in r},
              **{p: {k: v for k, v in r[p].items() if k != "log_ratio"} for p in CACHE_POLICIES}} for r in rows]
    return dict(
        notebook="29_stale_kv_cache", reproduced=reproduced, fixed=fixed, not_shown=not_shown(rows, last),
        metrics={"clip": clip, "updates": plain},
        headline={"what": f"mean |log μ_engine − log π_trainer| per token on repeated prompts after {last['updates']} weight "
                          f"updates (new prompts: {last['keep']['new_gap']:.1e})", "unit": "nats per token",
                  "bug": last["keep"]["repeated_gap"], "fix": last["invalidate"]["repeated_gap"]},
    )
