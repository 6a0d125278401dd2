"""Pitfall P27: the off-policy remainder of a generation batch trained with ρ ≡ 1.

TRL's GRPOTrainer generates one *generation batch* every ``steps_per_generation`` micro-steps and trains
on it one slice per micro-step, while the optimiser steps every ``gradient_accumulation_steps`` (GA)
micro-steps. When an optimiser step fires *inside* a generation batch, the slices after it are trained
by a newer policy than the one that sampled them: they are off-policy, and PPO's ratio π_θ / π_old needs
π_old = the policy at generation time. TRL 0.18.0–0.19.1 kept that snapshot only when
``num_iterations > 1 or steps_per_generation > gradient_accumulation_steps``; otherwise the loss took
``per_token_logps.detach()`` — the current policy's own log-probs — as π_old. With
``steps_per_generation < GA`` and GA not a multiple of it (3 and 4, say) the remainder slices came after
``optimizer.step()`` and were trained with ratio exactly 1: no importance weight, nothing clipped (TRL PR
#3493, which first proposed a ``ValueError`` in ``GRPOConfig``; TRL 0.20.0 snapshots whenever
``GA % (steps_per_generation × num_iterations) != 0``; PR #5757 later proposed a tighter per-window test).

The fix: keep π_old from generation time for every generation batch that an optimiser step can split.

This module runs the schedule on the tiny model: GRPO with a clipped ratio, one generation batch per
``steps_per_generation`` micro-steps, an optimiser step every GA micro-steps, π_old chosen by either
guard. Every slice records the ratio the loss saw and the true one against the sampler's log-probs μ.
"""

from __future__ import annotations

import copy
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.core.losses import group_advantages, outside_clip_window, ppo_policy_loss
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import decode_responses, encode_prompts, reward
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars

GUARDS = ("trl-0.20", "trl-0.19")  # the fix, the bug: when the trainer keeps a generation-time π_old


# ---- measurements --------------------------------------------------------------------------------
def snapshots_old_logprobs(steps_per_generation: int, gradient_accumulation_steps: int, num_iterations: int = 1,
                           guard: str = "trl-0.20") -> bool:
    """Whether the trainer computes π_old at generation time (else the loss uses the current log-probs, detached).

    ``"trl-0.19"`` (TRL 0.18.0–0.19.1, the bug): ``num_iterations > 1 or steps_per_generation > GA``.
    ``"trl-0.20"`` (TRL ≥ 0.20.0, the fix): ``GA % (steps_per_generation × num_iterations) != 0``.
    """
    if guard not in GUARDS:
        raise ValueError(f"guard={guard!r}; use one of {GUARDS} ('trl-0.20' is the fix)")
    if min(steps_per_generation, gradient_accumulation_steps, num_iterations) < 1:
        raise ValueError(f"steps_per_generation={steps_per_generation}, gradient_accumulation_steps="
                         f"{gradient_accumulation_steps}, num_iterations={num_iterations}: each must be ≥ 1")
    if guard == "trl-0.19":
        return num_iterations > 1 or steps_per_generation > gradient_accumulation_steps
    return gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0


def schedule(steps_per_generation: int, gradient_accumulation_steps: int, micro_steps: int) -> list[dict]:
    """One row per micro-step t: the generation batch and slice it trains on, the policy version that sampled
    it (the optimiser steps after micro-steps GA−1, 2GA−1, …) and the version that trains on it; lag = their gap."""
    rows = []
    for t in range(micro_steps):
        generated_at = t - t % steps_per_generation
        generated_by, trained_by = generated_at // gradient_accumulation_steps, t // gradient_accumulation_steps
        rows.append({"micro_step": t, "generation": t // steps_per_generation, "slice": t % steps_per_generation,
                     "generated_by": generated_by, "trained_by": trained_by, "lag": trained_by - generated_by})
    return rows


def off_policy_share(steps_per_generation: int, gradient_accumulation_steps: int) -> float:
    """Share of micro-steps trained by a newer policy than the one that sampled them, over one period
    (lcm of the two): 0 exactly when GA is a multiple of ``steps_per_generation``."""
    period = math.lcm(steps_per_generation, gradient_accumulation_steps)
    return sum(r["lag"] > 0 for r in schedule(steps_per_generation, gradient_accumulation_steps, period)) / period


@torch.no_grad()
def generation_batch(actor, tokenizer, problems, *, group_size: int, seed: int, max_new_tokens: int) -> dict:
    """``group_size`` responses per problem sampled from ``actor`` (groups contiguous), the sampler's log-probs μ,
    rewards and group advantages."""
    prompts = [p for p in problems for _ in range(group_size)]
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in prompts])
    rollout = sample(actor, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    texts = decode_responses(tokenizer, rollout.response_ids, rollout.response_mask)
    rewards = torch.tensor([reward(t, bool(f), p) for t, f, p in zip(texts, rollout.finished.tolist(), prompts, strict=True)])
    return {"rollout": rollout, "advantages": group_advantages(rewards.float(), group_size)}


def step_row(micro_step: int, generated_by: int, trained_by: int, logp: torch.Tensor, old_logp: torch.Tensor,
             sampler_logp: torch.Tensor, mask: torch.Tensor, clip: float, logged_clip_fraction: float,
             advantages: torch.Tensor | None = None) -> dict:
    """What one micro-step's loss saw: the ratio against its π_old vs the true ratio against the sampler's μ; with the
    slice's GRPO ``advantages``, how many of its responses carry a non-zero one (0 everywhere: no gradient)."""
    m = mask.bool()
    seen, true = (logp - old_logp)[m].detach(), (logp - sampler_logp)[m].detach()
    return {"micro_step": micro_step, "generated_by": generated_by, "trained_by": trained_by, "lag": trained_by - generated_by,
            "seen_log_ratio": seen, "true_log_ratio": true,
            "seen_clip_fraction": outside_clip_window(seen, clip), "true_clip_fraction": outside_clip_window(true, clip),
            "logged_clip_fraction": logged_clip_fraction,
            "responses": int(advantages.numel()) if advantages is not None else 0,
            "responses_with_advantage": int((advantages != 0).sum()) if advantages is not None else 0,
            "max_weight_error": float((seen.exp() - true.exp()).abs().max()) if seen.numel() else 0.0}


def train_generation_batches(model, tokenizer, problems, *, steps_per_generation: int, gradient_accumulation_steps: int,
                             micro_steps: int, guard: str, prompts_per_slice: int = 4, group_size: int = 4,
                             lr: float = 1e-3, clip: float = 0.2, seed: int = 0, max_new_tokens: int = 6) -> list[dict]:
    """GRPO on a copy of ``model`` for ``micro_steps`` micro-steps: a generation batch of
    ``steps_per_generation × prompts_per_slice`` problems (``group_size`` responses each) every
    ``steps_per_generation`` micro-steps, one slice per micro-step, Adam every ``gradient_accumulation_steps``;
    π_old from generation time where ``guard`` keeps it, else the current log-probs detached. One ``step_row``
    per micro-step."""
    spg, ga = steps_per_generation, gradient_accumulation_steps
    keep_old = snapshots_old_logprobs(spg, ga, 1, guard)
    actor = copy.deepcopy(model).train(False)
    optimizer = torch.optim.Adam(actor.parameters(), lr=lr)
    rows_per_slice, version, rows = prompts_per_slice * group_size, 0, []
    for t in range(micro_steps):
        if t % spg == 0:
            start = (t // spg) * spg * prompts_per_slice
            chosen = [problems[(start + i) % len(problems)] for i in range(spg * prompts_per_slice)]
            batch = generation_batch(actor, tokenizer, chosen, group_size=group_size, seed=seed + t, max_new_tokens=max_new_tokens)
            r, generated_by = batch["rollout"], version
            with torch.no_grad():
                old = response_logprobs(actor, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask) if keep_old else None
        part = slice((t % spg) * rows_per_slice, (t % spg + 1) * rows_per_slice)
        mask = r.response_mask[part]
        logp = response_logprobs(actor, r.prompt_ids[part], r.prompt_mask[part], r.response_ids[part], mask)
        old_logp = old[part] if old is not None else logp.detach()  # the bug's π_old: the current policy itself
        loss, stats = ppo_policy_loss(logp, old_logp, batch["advantages"][part].unsqueeze(-1), mask, clip_low=clip)
        (loss / ga).backward()
        rows.append(step_row(t, generated_by, version, logp, old_logp, r.rollout_logprobs[part], mask, clip, stats["clip_fraction"],
                             advantages=batch["advantages"][part]))
        if (t + 1) % ga == 0:
            optimizer.step()
            optimizer.zero_grad()
            version += 1
    return rows


def with_clip_fractions(row: dict, clip: float) -> dict:
    """``row`` with the shares outside the ε window over its off-policy tokens: true, seen by the loss, logged."""
    off = [s for s in row["steps"] if s["lag"] > 0]
    logged = sum(s["logged_clip_fraction"] for s in off) / len(off) if off else 0.0
    return {**row, "clip": clip, "true_clip_fraction": outside_clip_window(row["true_log_ratio"], clip),
            "seen_clip_fraction": outside_clip_window(row["seen_log_ratio"], clip), "logged_clip_fraction": logged}


def summarise(steps: list[dict], steps_per_generation: int, gradient_accumulation_steps: int, guard: str, clip: float) -> dict:
    """One run in numbers: the off-policy micro-steps' tokens, the share outside the clip window seen by the
    loss vs true (``with_clip_fractions``), the largest |ρ_seen − ρ_true| anywhere and the largest true |log ρ| (how far
    the optimiser steps moved the policy from the sampler), and how many responses carried a non-zero advantage."""
    off = [s for s in steps if s["lag"] > 0]
    seen = torch.cat([s["seen_log_ratio"] for s in off]) if off else torch.zeros(0)
    true = torch.cat([s["true_log_ratio"] for s in off]) if off else torch.zeros(0)
    return with_clip_fractions({"steps_per_generation": steps_per_generation, "gradient_accumulation_steps": gradient_accumulation_steps,
            "remainder": gradient_accumulation_steps % steps_per_generation, "guard": guard,
            "snapshot": snapshots_old_logprobs(steps_per_generation, gradient_accumulation_steps, 1, guard),
            "off_policy_share": len(off) / len(steps), "off_policy_tokens": int(true.numel()),
            "seen_log_ratio": seen, "true_log_ratio": true,
            "mean_abs_log_ratio": float(true.abs().mean()) if true.numel() else 0.0,
            "max_abs_log_ratio": float(true.abs().max()) if true.numel() else 0.0,
            "responses": sum(s.get("responses", 0) for s in steps),
            "responses_with_advantage": sum(s.get("responses_with_advantage", 0) for s in steps),
            "max_weight_error": max(s["max_weight_error"] for s in steps), "steps": steps}, clip)


# ---- sweeps --------------------------------------------------------------------------------------
def steps_per_generation_sweep(model, tokenizer, problems, steps_per_generation: list[int], *, gradient_accumulation_steps: int,
                               micro_steps: int, clip: float = 0.2, **train) -> list[dict]:
    """For each ``steps_per_generation`` and each guard, ``train_generation_batches`` and its ``summarise`` row (one
    run per distinct π_old choice: where both guards agree, their rows share it)."""
    rows, runs = [], {}
    settings = [(spg, guard) for spg in steps_per_generation for guard in GUARDS]
    for spg, guard in progress.track(settings, "steps_per_generation × guard", unit="setting"):
        # both guards choose the same π_old unless the setting is the bug's: the run is then the same (same seeds)
        key = (spg, snapshots_old_logprobs(spg, gradient_accumulation_steps, 1, guard))
        if key not in runs:
            runs[key] = train_generation_batches(model, tokenizer, problems, steps_per_generation=spg, guard=guard, clip=clip,
                                                 gradient_accumulation_steps=gradient_accumulation_steps,
                                                 micro_steps=micro_steps, **train)
        rows.append(summarise(runs[key], spg, gradient_accumulation_steps, guard, clip))
    return rows


def headline_rows(rows: list[dict]) -> tuple[dict, dict]:
    """The TRL 0.19 (bug) and TRL 0.20 (fix) runs of the setting the bug hits hardest: off-policy micro-steps and no
    snapshot under the bug's guard, the largest off-policy share (first such ``steps_per_generation``); else each
    guard's first run."""
    hit = [r for r in rows if r["guard"] == "trl-0.19" and not r["snapshot"] and r["off_policy_share"] > 0]
    spg = max(hit, key=lambda r: r["off_policy_share"])["steps_per_generation"] if hit else None

    def run(guard: str) -> dict:
        return next(r for r in rows if r["guard"] == guard and (spg is None or r["steps_per_generation"] == spg))

    return run("trl-0.19"), run("trl-0.20")


# ---- verdict -------------------------------------------------------------------------------------
def verdict(rows: list[dict], *, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``steps_per_generation_sweep`` rows.

    Reproduced: under TRL 0.19's guard some setting trains off-policy micro-steps without a snapshot, the true
    ratio of their tokens leaves the clip window (true clip fraction > 0), and the loss sees none of it (ratio
    ≡ 1: seen clip fraction 0, logged clip fraction 0). Fixed: under TRL 0.20's guard every micro-step's loss
    sees the true ratio (max |ρ_seen − ρ_true| ≤ ``tolerance``).
    """
    reproduced = any(r["guard"] == "trl-0.19" and not r["snapshot"] and r["off_policy_share"] > 0 and r["true_clip_fraction"] > 0
                     and r["seen_clip_fraction"] == 0 and r["logged_clip_fraction"] == 0 for r in rows)
    fix = [r for r in rows if r["guard"] == "trl-0.20"]
    fixed = bool(fix) and all(r["max_weight_error"] <= tolerance for r in fix)
    return reproduced, fixed


def not_shown(rows: list[dict], bug: dict, *, tolerance: float = 1e-4) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None (shown, or no setting that the bug hits: a parameter choice
    that ``headline_sentence`` names). When the optimiser steps leave the policy where it sampled (true |log ρ| ≤
    ``tolerance`` on every off-policy token: a checkpoint that never earns the task's reward gets GRPO advantages of 0
    and no gradient), a ratio of 1 is the true one and there is nothing off-policy to hide. ``bug``: the first of
    ``headline_rows``."""
    if verdict(rows, tolerance=tolerance)[0]:
        return None
    if bug["snapshot"] or bug["off_policy_share"] == 0 or bug["max_abs_log_ratio"] > tolerance:
        return None
    why = (f"every GRPO advantage was 0 (in each group of the {bug['responses']} sampled responses the rewards were equal), so "
           "there was no gradient" if bug["responses_with_advantage"] == 0 else
           f"{bug['responses_with_advantage']} of {bug['responses']} sampled responses had a non-zero GRPO advantage")
    return (f"the optimiser steps did not move this checkpoint's policy: on the {bug['off_policy_tokens']} off-policy tokens "
            f"(GA {bug['gradient_accumulation_steps']}, steps_per_generation {bug['steps_per_generation']}) the true |log ρ| is at "
            f"most {bug['max_abs_log_ratio']:.1e} ≤ {tolerance:g}; {why}: nothing off-policy for ρ ≡ 1 to hide; use a checkpoint "
            "that solves some of the problems")


# ---- figures -------------------------------------------------------------------------------------
TRUE_COLORS = (plots.NEUTRAL_COLOR, "#BBBBBB")  # the true share's bars: an off-policy slice, an on-policy one


def plot_timeline(ax, row: dict) -> None:
    """One run, micro-step by micro-step: the true share of tokens outside the clip window (bars, dark where the
    slice is off-policy), what the loss saw (dots), optimiser steps (dashed) and generations (triangles)."""
    steps, ga, spg = row["steps"], row["gradient_accumulation_steps"], row["steps_per_generation"]
    bug = row["guard"] == "trl-0.19"
    x = [s["micro_step"] for s in steps]
    ax.bar(x, [s["true_clip_fraction"] for s in steps], 0.7, color=[TRUE_COLORS[0] if s["lag"] else TRUE_COLORS[1] for s in steps],
           label="true (vs μ); dark: off-policy")
    ax.plot(x, [s["seen_clip_fraction"] for s in steps], "o", color=plots.bug_fix_color(bug),
            label=f"seen, {row['guard']} guard" + (" (bug)" if bug else " (fix)"))
    top = max([s["true_clip_fraction"] for s in steps] + [0.05])
    for t in range(ga - 1, len(steps) - 1, ga):
        ax.axvline(t + 0.5, color=plots.NEUTRAL_COLOR, ls="--", lw=1)
    ax.plot([t for t in x if t % spg == 0], [1.08 * top] * len(range(0, len(steps), spg)), "v", color=plots.SERIES_COLORS[2],
            label="generation")
    ax.set_ylim(0, 1.2 * top)
    plots.integer_axis(ax.xaxis)
    ax.set_xlabel("micro-step")
    ax.set_ylabel("share outside ε")
    ax.set_title(f"one run: GA = {ga}, steps_per_generation = {spg}", fontsize=10)


def plot_sweep(ax, rows: list[dict]) -> None:
    """Share of off-policy tokens outside the clip window as seen by the loss, per ``steps_per_generation``:
    TRL 0.19's guard (bug) vs TRL 0.20's (fix); "on-policy" where no micro-step is off-policy."""
    spgs = sorted({r["steps_per_generation"] for r in rows})
    by = {(r["steps_per_generation"], r["guard"]): r for r in rows}
    x = list(range(len(spgs)))
    fix = ax.bar([i - 0.2 for i in x], [by[s, "trl-0.20"]["seen_clip_fraction"] for s in spgs], 0.4, color=plots.FIX_COLOR,
                 label="seen, TRL 0.20 guard (fix) = true")
    bug = ax.bar([i + 0.2 for i in x], [by[s, "trl-0.19"]["seen_clip_fraction"] for s in spgs], 0.4, color=plots.BUG_COLOR,
                 label="seen, TRL 0.19 guard (bug)")
    off = [i for i, s in enumerate(spgs) if by[s, "trl-0.19"]["off_policy_share"] > 0]
    label_zero_bars(ax, [b for i, b in enumerate(bug) if i in off])
    label_zero_bars(ax, [b for i, b in enumerate(fix) if i in off])
    for i in x:
        if i not in off:
            ax.text(i, 0.0, "on-policy", ha="center", va="bottom", fontsize=8, rotation=90, color=plots.NEUTRAL_COLOR)
    ga = rows[0]["gradient_accumulation_steps"]
    ax.set_xticks(x, [f"{s} (r = {ga % s})" for s in spgs], fontsize=9)
    ax.set_xlabel(f"steps_per_generation (r = GA mod it, GA = {ga})")
    ax.set_ylabel("share outside ε")
    ax.set_ylim(0, 1.5 * max([r["true_clip_fraction"] for r in rows] + [0.05]))
    ax.set_title("off-policy tokens, every setting", fontsize=10)


def plot_log_ratio(ax, bug: dict, fix: dict, clip: float) -> None:
    """Histogram of log ρ on the off-policy tokens: what the loss saw with each guard, and the clip window (dashed)."""
    series = [(fix["seen_log_ratio"].numpy(), plots.FIX_COLOR, f"seen, {fix['guard']} guard (fix)"),
              (bug["seen_log_ratio"].numpy(), plots.BUG_COLOR, f"seen, {bug['guard']} guard (bug)")]
    plots.plot_log_ratio_histogram(ax, series, clip, torch.linspace(-1.0, 1.0, 51).numpy(), "log ratio per off-policy token")
    ax.set_title(f"steps_per_generation = {bug['steps_per_generation']}", fontsize=10)


def figure_remainder(rows: list[dict], head: tuple[dict, dict], clip: float):
    """The notebook's figure: the bug's timeline, the sweep over steps_per_generation, the log-ratio histogram of the
    ``headline_rows`` ``head``, one panel under the other; one legend above them (``remainder_note`` is the caption)."""
    from matplotlib.lines import Line2D  # matplotlib: only when a figure is drawn
    from matplotlib.patches import Patch  # matplotlib: only when a figure is drawn

    bug, fix = head
    fig, axes = plots.panel_grid(3, columns=1, panel_height=2.3)
    plot_timeline(axes[0], bug)
    plot_sweep(axes[1], rows)
    plot_log_ratio(axes[2], bug, fix, clip)
    handles = [Patch(color=TRUE_COLORS[0], label="true share (vs the sampler's μ)"),
               Patch(color=plots.BUG_COLOR, label="seen, TRL 0.19 guard (bug)"),
               Patch(color=plots.FIX_COLOR, label="seen, TRL 0.20 guard (fix)"),
               Line2D([], [], ls="none", marker="v", color=plots.SERIES_COLORS[2], label="generation")]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=9)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def sweep_lines(rows: list[dict]) -> str:
    return "\n".join(
        f"steps_per_generation {r['steps_per_generation']} (GA {r['gradient_accumulation_steps']}, "
        f"r = GA mod {r['steps_per_generation']} = {r['remainder']}), "
        f"{r['guard']} guard: π_old {'from generation time' if r['snapshot'] else '= current, detached'}; "
        f"{r['off_policy_share']:.0%} of micro-steps off-policy ({r['off_policy_tokens']} tokens, mean |log ρ| "
        f"{r['mean_abs_log_ratio']:.3f}); outside ε = {r['clip']:g}: true {r['true_clip_fraction']:.1%}, seen "
        f"{r['seen_clip_fraction']:.1%}, logged clip fraction {r['logged_clip_fraction']:.1%}; max |ρ_seen − ρ_true| "
        f"{r['max_weight_error']:.1e}" for r in rows)


def remainder_note(rows: list[dict], head: tuple[dict, dict], clip: float) -> str:
    """The caption printed under ``figure_remainder``: what each panel draws, in words the labels leave out."""
    bug, _ = head
    return (f"Top: the TRL 0.19 run with steps_per_generation = {bug['steps_per_generation']}, micro-step by micro-step: the "
            f"true share of tokens whose ratio to the sampler's μ lies outside [1 − ε, 1 + ε], ε = {clip:g} (bars, dark on "
            "off-policy slices), the share the loss saw (dots), optimiser steps (dashed) and generations (triangles). Middle: "
            "the share on the off-policy tokens as the loss saw it, for every steps_per_generation (r: the remainder of GA by "
            "it; a bar labelled 0 is exactly 0). Bottom: the log ratio per off-policy token the loss saw with each guard, "
            "clamped to ±1; dashed: the clip window.")


def headline_sentence(rows: list[dict], head: tuple[dict, dict]) -> str:
    """The verdict's reading, with the share of tokens outside the clip window in the ``headline_rows`` ``head``."""
    reproduced, fixed = verdict(rows)
    bug, fix = head
    if not reproduced:
        return ("no setting showed the bug: either every steps_per_generation divides GA (nothing is off-policy) or the "
                "policy moved too little in one optimiser step for a token to leave the clip window — raise the learning "
                "rate or pick steps_per_generation < GA that does not divide it")
    return (f"with GA = {bug['gradient_accumulation_steps']} and steps_per_generation = {bug['steps_per_generation']}, "
            f"{bug['off_policy_share']:.0%} of the micro-steps train on data of an older policy; {bug['true_clip_fraction']:.1%} "
            f"of their tokens lie outside the ε = {bug['clip']:g} window, but TRL 0.19's guard shows the loss "
            f"{bug['seen_clip_fraction']:.0%} (ratio ≡ 1)"
            + (f"; TRL 0.20's guard keeps π_old from generation time and the loss sees {fix['seen_clip_fraction']:.1%}."
               if fixed else "; TRL 0.20's guard did not reproduce the sampler's ratio (check the dtype).")
            )


# ---- explorer ------------------------------------------------------------------------------------
def remainder_explorer(rows: list[dict], bug: dict, clip: float = 0.2) -> Explorer:
    """Controls for steps_per_generation, the guard and ε: that run's timeline, redrawn; it opens on the setting of
    ``bug`` (the first of ``headline_rows``)."""

    def draw(steps_per_generation, guard, epsilon):
        row = next(r for r in rows if r["steps_per_generation"] == steps_per_generation and r["guard"] == guard)
        row = with_clip_fractions(row, epsilon)
        row = {**row, "steps": [{**s, "true_clip_fraction": outside_clip_window(s["true_log_ratio"], epsilon),
                                 "seen_clip_fraction": outside_clip_window(s["seen_log_ratio"], epsilon)} for s in row["steps"]]}
        fig, ax = plt.subplots(figsize=(7, 3.4))
        plot_timeline(ax, row)
        ax.legend(**{**plots.LEGEND_BELOW, "ncol": 3})
        ax.set_title(f"{row['off_policy_share']:.0%} of micro-steps off-policy; outside ε: true {row['true_clip_fraction']:.1%}, "
                     f"seen {row['seen_clip_fraction']:.1%}", fontsize=9)
        return {"steps_per_generation": steps_per_generation, "guard": guard,
                "true_clip_fraction": row["true_clip_fraction"], "seen_clip_fraction": row["seen_clip_fraction"]}

    spgs = sorted({r["steps_per_generation"] for r in rows})
    return Explorer({"steps_per_generation": widgets.SelectionSlider(options=spgs, value=bug["steps_per_generation"],
                                                                     description="steps/gen"),
                     "guard": widgets.ToggleButtons(options=list(GUARDS), value="trl-0.19", description="guard"),
                     "epsilon": widgets.FloatSlider(value=clip, min=0.01, max=0.5, step=0.01, description="ε")},
                    draw, title="P27: the remainder of a generation batch after optimizer.step()")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], head: tuple[dict, dict]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 27 (``head``: ``headline_rows(rows)``)."""
    reproduced, fixed = verdict(rows)
    bug, fix = head
    tensors = ("seen_log_ratio", "true_log_ratio", "steps")
    return dict(
        notebook="27_off_policy_remainder", reproduced=reproduced, fixed=fixed, not_shown=not_shown(rows, bug),
        metrics={"runs": [{k: v for k, v in r.items() if k not in tensors} for r in rows]},
        headline={"what": f"share of off-policy tokens outside the ε = {bug['clip']:g} clip window seen by the loss "
                          f"(GA {bug['gradient_accumulation_steps']}, steps_per_generation {bug['steps_per_generation']}; "
                          f"true: {bug['true_clip_fraction']:.3f})", "unit": "fraction of tokens",
                  "bug": bug["seen_clip_fraction"], "fix": fix["seen_clip_fraction"]},
    )
