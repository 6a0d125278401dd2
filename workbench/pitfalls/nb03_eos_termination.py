"""Pitfall S3: rollouts that do not stop at EOS (and P8: pad token = EOS token).

TRL's old PPOTrainer built its generation config without ``eos_token_id``: every rollout decoded
``max_new_tokens`` steps and the text after the stop token was cut afterwards. In a batch, decoding
can stop only when every row has finished, so the saving of the fix is
``max_new_tokens − longest response`` steps per batch, and every token after a row's EOS is waste.

``generation_cost`` measures both modes on the same prompts with the same random stream (the
responses are identical, only the compute differs). ``eos_in_loss_mask`` shows the P8 variant: a
loss mask inferred as ``ids != pad`` drops the EOS action when pad == EOS.
"""

from __future__ import annotations

import ipywidgets as widgets
import torch

from workbench.core import progress
from workbench.experiments import comparison, statistics
from workbench.experiments.comparison import train_variants
from workbench.modeling.rollout import Rollout, sample, truncate_after_eos
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer

PPO_VARIANTS = {"stop_at_eos=False (bug)": {"stop_at_eos": False}, "stop_at_eos=True (fix)": {"stop_at_eos": True}}


# ---- measurements -------------------------------------------------------------------------------
def rollout_pair(model, tokenizer, prompts: list[str], *, max_new_tokens: int, seed: int = 0,
                 temperature: float = 1.0) -> dict[str, Rollout]:
    """The same prompts sampled with ``stop_at_eos`` True (fix) and False (bug), same random stream."""
    ids, mask = encode_prompts(tokenizer, prompts)
    out = {}
    for name, stop in (("fix", True), ("bug", False)):
        out[name] = sample(
            model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, temperature=temperature, stop_at_eos=stop,
            generator=torch.Generator().manual_seed(seed),
        )
    return out


def generation_cost(rollout: Rollout) -> dict:
    """Decode steps, tokens generated/needed, waste, wall time of one rollout."""
    return {
        "decode_steps": rollout.decode_steps,
        "tokens_generated": rollout.tokens_generated,
        "tokens_needed": rollout.tokens_needed,
        "waste_fraction": rollout.waste_fraction,
        "seconds": rollout.seconds,
        "longest_response": int(rollout.response_lengths.max()),
        "finished_fraction": float(rollout.finished.float().mean()),
    }


def same_responses(a: Rollout, b: Rollout) -> bool:
    """Identical kept tokens and masks (the wider rollout's extra columns must be fully masked)."""
    width = min(a.response_ids.shape[1], b.response_ids.shape[1])
    wider = a if a.response_ids.shape[1] > width else b
    return (
        torch.equal(a.response_ids[:, :width], b.response_ids[:, :width])
        and torch.equal(a.response_mask[:, :width], b.response_mask[:, :width])
        and int(wider.response_mask[:, width:].sum()) == 0
    )


def mask_from_pad(response_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """The naive loss mask ``ids != pad`` some trainers infer after the fact."""
    return (response_ids != pad_token_id).long()


def eos_in_loss_mask(response_ids: torch.Tensor, loss_mask: torch.Tensor, eos_token_id: int) -> int:
    """How many EOS actions the loss mask keeps (each finished response should keep one)."""
    return int(((response_ids == eos_token_id) & loss_mask.bool()).sum())


def one_step_gap(model_name: str, *, max_new_tokens: int, seed: int = 0, prompts_per_step: int = 16,
                 **loading) -> tuple[dict, dict, float]:
    """One PPO step from the same weights with ``stop_at_eos`` True and False: both step records and
    the largest |difference| in reward, KL and losses (0 when masking after EOS is exact). ``loading``
    (``device``, ``pad_token``, ``precision``) goes to ``comparison.train_variants``."""
    runs = train_variants("ppo", model_name, {"fix": {"stop_at_eos": True}, "bug": {"stop_at_eos": False}}, steps=1,
                          seeds=(seed,), max_new_tokens=max_new_tokens, prompts_per_step=prompts_per_step, mini_batches=2,
                          **loading)
    fix, bug = runs["fix"][0][0], runs["bug"][0][0]
    return fix, bug, max(abs(fix[k] - bug[k]) for k in ("policy_loss", "value_loss", "reward", "kl"))


def pad_equals_eos_masks(rollout: Rollout, eos_token_id: int) -> dict:
    """The loss masks of one rollout with pad ≠ EOS (explicit mask) and with pad = EOS (``ids != pad``)."""
    ids_pad_is_eos, _ = truncate_after_eos(rollout.response_ids, eos_token_id, eos_token_id)
    naive = mask_from_pad(ids_pad_is_eos, eos_token_id)
    return {"distinct": (rollout.response_ids, rollout.response_mask), "pad_is_eos": (ids_pad_is_eos, naive),
            "eos_kept_distinct": eos_in_loss_mask(rollout.response_ids, rollout.response_mask, eos_token_id),
            "eos_kept_pad_is_eos": eos_in_loss_mask(ids_pad_is_eos, naive, eos_token_id),
            "finished": int(rollout.finished.sum())}


# ---- sweeps -------------------------------------------------------------------------------------
def cost_sweep(model, tokenizer, prompts: list[str], batch_sizes, *, max_new_tokens: int, seed: int = 0) -> dict:
    """``{batch_size: {"bug": cost, "fix": cost}}``; raises if stopping at EOS changed a kept token."""
    costs = {}
    for batch_size in progress.track(batch_sizes, "rollouts by batch size", unit="batch size"):
        pair = rollout_pair(model, tokenizer, prompts[:batch_size], max_new_tokens=max_new_tokens, seed=seed)
        if not same_responses(pair["fix"], pair["bug"]):
            raise AssertionError("stopping at EOS changed the kept tokens: the two rollouts must be identical")
        costs[batch_size] = {name: generation_cost(r) for name, r in pair.items()}
    return costs


def ppo_split(runs: dict) -> tuple[int | None, float]:
    """(first step whose reward differs, largest |reward difference|) between the bug and fix runs of the first seed."""
    bug_run, fix_run = (r[0] for r in runs.values())
    split = comparison.first_divergence(bug_run, fix_run, "reward", tolerance=1e-6)
    return split, max(abs(a["reward"] - b["reward"]) for a, b in zip(bug_run, fix_run, strict=False))


def ppo_effects(runs: dict) -> dict:
    """Bug vs fix on the tokens generated per step and on the reward (``statistics.effect``)."""
    return {key: statistics.effect(runs, key, *PPO_VARIANTS) for key in ("tokens_generated", "reward")}


# ---- verdict ------------------------------------------------------------------------------------
# How far one PPO step may move between stopping at EOS and decoding past it (masked), by the trainers' precision. The two
# batches have other widths, so kernels may sum in another order: fp32 noise ~1e-8 (measured 6e-9 on the tiny model);
# under bf16 autocast float noise is bf16's (eps 3.9e-3 relative), measured 1.5e-4 on an H200 in smoke mode (docs/journal/2026-11-27.md).
# Pure bf16 was not measured: it gets bf16-mixed's tolerance.
LOSS_TOLERANCE = {"fp32": 1e-6, "bf16-mixed": 1e-3, "bf16": 1e-3}


def loss_tolerance(precision: str) -> float:
    """``LOSS_TOLERANCE`` for ``precision``, with a clear error for a precision it does not know."""
    if precision not in LOSS_TOLERANCE:
        raise ValueError(f"precision={precision!r}; use one of {sorted(LOSS_TOLERANCE)} (the trainers' precisions)")
    return LOSS_TOLERANCE[precision]


def verdict(costs: dict, loss_gap: float, tolerance: float = LOSS_TOLERANCE["fp32"]) -> tuple[bool, bool]:
    """(reproduced, fixed): at the largest batch the bug decodes more steps and tokens than needed;
    with the fix every batch stops at its longest response and one PPO step is unchanged (≤ ``tolerance``:
    ``loss_tolerance(precision)`` in ``metrics``)."""
    largest = costs[max(costs)]
    reproduced = largest["bug"]["tokens_generated"] > largest["bug"]["tokens_needed"] and \
        largest["bug"]["decode_steps"] > largest["fix"]["decode_steps"]
    fixed = all(c["fix"]["decode_steps"] == c["fix"]["longest_response"] for c in costs.values()) and loss_gap <= tolerance
    return bool(reproduced), bool(fixed)


def not_shown(costs: dict) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when some response at the largest batch
    runs to the length limit (an untrained checkpoint rarely emits a stop id), stopping at EOS decodes
    as many steps as not stopping, so there is no saving to measure."""
    largest = costs[max(costs)]
    if largest["fix"]["decode_steps"] < largest["bug"]["decode_steps"]:
        return None
    return (f"at batch {max(costs)} some response runs to the limit of {largest['bug']['decode_steps']} tokens (only "
            f"{largest['fix']['finished_fraction']:.0%} emit a stop id): stopping at EOS saves no decode step with this "
            "checkpoint (an untrained one rarely stops); use a trained one")


# Stated before any run: without stopping at EOS every row decodes to ``max_new_tokens``, so a PPO step
# generates more tokens (and takes longer) while the masked loss stays the same. Long responses (the sums task) give
# the waste room.
PREDICTION = statistics.Prediction("tokens_generated", "tokens generated per PPO step (decoding past every row's EOS)", "+",
                                   "tokens")


# ---- figures ------------------------------------------------------------------------------------
PPO_PANELS = (("reward", "mean task reward"), ("tokens_generated", "tokens generated"), ("rollout_seconds", "rollout time (s)"))
COST_PANELS = ("decoding steps", "tokens thrown away (%)", "wall time (ms)")
BUG_FIX_LABELS = {"bug": "always max_new_tokens (bug)", "fix": "stop at EOS (fix)"}


def plot_generation_cost(axes, costs: dict) -> None:
    """Decoding steps, wasted share and wall time vs batch size, bug and fix (one legend under the panels: ``plots.figure_legend``)."""
    sizes = sorted(costs)
    for name, bug in (("bug", True), ("fix", False)):
        kw = {"color": plots.bug_fix_color(bug), "marker": "o" if bug else "s", "ls": "-" if bug else "--",
              "label": BUG_FIX_LABELS[name]}
        axes[0].plot(sizes, [costs[b][name]["decode_steps"] for b in sizes], **kw)
        axes[1].plot(sizes, [costs[b][name]["waste_fraction"] * 100 for b in sizes], **kw)
        axes[2].plot(sizes, [costs[b][name]["seconds"] * 1000 for b in sizes], **kw)
    for ax, label in zip(axes, COST_PANELS, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_title(label)
        top = ax.get_ylim()[1]
        ax.set_ylim(-0.03 * top, top * 1.05)  # from 0 (a count, a share, a time read as ratios only from 0), markers whole
    plots.integer_axis(axes[0].yaxis)


def figure_generation_cost(costs: dict):
    fig, axes = plots.panel_grid(3, panel_height=3.0)
    plot_generation_cost(axes, costs)
    plots.figure_legend(fig, axes[0])
    return fig


def plot_pad_eos_masks(axes, masks: dict, eos_token_id: int, rows: int = 16) -> None:
    """The two loss masks side by side, EOS cells in the EOS colour (hatched where the mask drops them)."""
    for ax, key, title in ((axes[0], "distinct", "pad ≠ EOS: EOS kept (fix)"),
                           (axes[1], "pad_is_eos", "pad = EOS, mask ids != pad (bug)")):
        ids, mask = masks[key]
        plots.plot_mask(ax, mask[:rows], title, xlabel="response token", eos=(ids[:rows] == eos_token_id) & (mask[:rows] > 0)
                        if key == "distinct" else _first_eos(ids[:rows], eos_token_id))


def _first_eos(ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """True at each row's first EOS (with pad = EOS, later EOS cells are padding)."""
    is_eos = ids == eos_token_id
    return is_eos & (is_eos.long().cumsum(-1) == 1)


def figure_pad_eos_masks(masks: dict, eos_token_id: int):
    """The two loss masks side by side over one key for both (the union of their keys) under the panels."""
    fig, axes = plots.panel_grid(2, panel_height=3.0)
    plot_pad_eos_masks(axes, masks, eos_token_id)
    axes[1].set_ylabel("")
    plots.figure_legend(fig, axes)
    return fig


def plot_ppo(axes, runs: dict) -> None:
    """Reward, tokens generated and rollout time per step of the first seed, bug and fix (3 axes), titled by panel."""
    colors = plots.bug_fix_colors(PPO_VARIANTS)
    for ax, (key, label) in zip(axes, PPO_PANELS, strict=True):
        plots.plot_curves(ax, comparison.first_seed(runs), key, "", colors)
        ax.set_title(label)


def figure_ppo(runs: dict):
    """``plot_ppo`` in a row, one legend under the panels (``ppo_note`` says what a ring and the seed are)."""
    fig, axes = plots.panel_grid(3, panel_height=3.0)
    plot_ppo(axes, runs)
    plots.figure_legend(fig, axes[0], labels=list(PPO_VARIANTS))
    return fig


# ---- printers -----------------------------------------------------------------------------------
def cost_lines(costs: dict) -> str:
    return "\n".join(f"batch {b:4d}: decode steps bug {c['bug']['decode_steps']:3d} / fix {c['fix']['decode_steps']:3d}; tokens bug "
                     f"{c['bug']['tokens_generated']:6d} / fix {c['fix']['tokens_generated']:6d} / needed {c['fix']['tokens_needed']:6d}"
                     for b, c in costs.items())


def missing_eos_note(scores: torch.Tensor, finished: torch.Tensor, penalty: float) -> str:
    """What ``missing_eos_penalty`` does to one batch, in words chosen by the counts: how many responses
    were cut (no EOS), how many finished and were wrong, and where the penalty puts the cut ones."""
    scores, finished = scores.float(), finished.bool()
    cut, n = int((~finished).sum()), len(finished)
    wrong = int((finished & (scores <= 0)).sum())
    line = f"{cut}/{n} responses truncated (no EOS), {n - cut} finished, {wrong} of them wrong"
    if cut == 0:
        return line + "; nothing is truncated at this budget, so the penalty changes nothing"
    before = float(scores[~finished].mean())
    line += f"; truncated mean score {before:.3f} → {before - penalty:.3f} with missing_eos_penalty={penalty}"
    if wrong == 0:
        return line + "; no finished-but-wrong answer here to compare the truncated ones with"
    floor = float(scores[finished & (scores <= 0)].max())
    side = "below" if before - penalty < floor else "not below"
    return line + f", {side} the finished-but-wrong answers (score {floor:.3f})"


def ppo_sentence(split: tuple[int | None, float], steps: int) -> str:
    """Where the rewards of the bug and fix runs part (``split = ppo_split(runs)``), in words; the reward effect is in
    ``statistics.training_summary``'s table."""
    first, curve_gap = split
    if first is None:
        return f"identical rewards at every one of the {steps} steps"
    if first == 0:
        return f"the rewards differ from the first step on (largest gap {curve_gap:.2e})"
    return (f"identical rewards up to step {first - 1}, then rounding differences grow into different samples "
            f"(largest gap {curve_gap:.2e})")


def one_step_line(step_fix: dict, step_bug: dict, loss_gap: float, precision: str = "fp32") -> str:
    """``one_step_gap``'s reading: the largest difference against the float-rounding tolerance of ``precision``, and the
    tokens each mode generated."""
    tolerance = loss_tolerance(precision)
    reading = "the same step up to float rounding" if loss_gap <= tolerance else "a different step"
    return (f"largest |difference| in reward/KL/policy and value losses: {loss_gap:.2e} ({reading}: tolerance "
            f"{tolerance:.0e} in {precision}); tokens generated {step_bug['tokens_generated']} (bug) vs "
            f"{step_fix['tokens_generated']} (fix), {step_fix['tokens_needed']} needed")


def training_lines(effects: dict, runs: dict, task: str) -> str:
    """``statistics.training_summary`` of the PPO runs (one seed by default: the noise is the step-to-step spread)."""
    return statistics.training_summary(effects, runs, PREDICTION, task)


def generation_cost_note(max_new_tokens: int) -> str:
    """The caption of ``figure_generation_cost``."""
    return (f"Per batch size (log scale): decoding steps of the batch (the bug always decodes max_new_tokens = "
            f"{max_new_tokens}), the share of generated tokens after a row's EOS, and the rollout's wall time.")


def pad_eos_note(rows: int = 16) -> str:
    """The caption of ``figure_pad_eos_masks``."""
    return (f"The first {rows} responses' loss masks (blue: trained on, pale: masked). Left: pad ≠ EOS, the mask kept from "
            "sampling, each EOS (orange) in it. Right: pad = EOS and a mask inferred as ids != pad: every EOS is dropped "
            "(hatched), so stopping is never trained.")


def ppo_note(seed: int) -> str:
    """The caption of ``figure_ppo``."""
    return (f"One seed (seed {seed}), so no seed band. A ring marks the fix where it lies under the bug: identical values "
            "draw one line.")


# ---- explorer -----------------------------------------------------------------------------------
def eos_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """Decoding steps and wasted tokens with and without EOS stopping."""

    def draw(batch_size, max_new_tokens):
        costs = cost_sweep(model, tokenizer, prompts, [batch_size], max_new_tokens=max_new_tokens, seed=seed)
        figure_generation_cost(costs)
        return costs[batch_size]

    controls = {
        "batch_size": widgets.IntSlider(value=16, min=1, max=len(prompts), description="batch size"),
        "max_new_tokens": widgets.IntSlider(value=16, min=2, max=64, description="max_new_tokens"),
    }
    return Explorer(controls, draw, "What decoding past EOS costs")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, costs: dict, loss_gap: float, masks: dict, split: tuple[int | None, float], effects: dict, task: str = "arith",
            precision: str = "fp32") -> dict:
    """Notebook 03's ``notebook_api.write_metrics`` keyword arguments (``split``: ``ppo_split(runs)``, ``effects``:
    ``ppo_effects(runs)``; ``precision``: the trainers', for the loss tolerance)."""
    reproduced, fixed = verdict(costs, loss_gap, loss_tolerance(precision))
    bug, fix = costs[max(costs)]["bug"], costs[max(costs)]["fix"]
    first_split, curve_gap = split
    return {
        "notebook": "03_eos_termination", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(costs),
        "metrics": {"tokens_generated_bug": bug["tokens_generated"], "tokens_generated_fix": fix["tokens_generated"],
                    "tokens_needed": fix["tokens_needed"], "waste_fraction_bug": bug["waste_fraction"],
                    "waste_fraction_fix": fix["waste_fraction"], "decode_steps_bug": bug["decode_steps"],
                    "decode_steps_fix": fix["decode_steps"], "one_step_loss_gap": loss_gap,
                    "one_step_loss_tolerance": loss_tolerance(precision), "ppo_curve_reward_gap": curve_gap,
                    "ppo_first_split_step": first_split,
                    "ppo_effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
                    "eos_actions_in_mask_pad_distinct": masks["eos_kept_distinct"],
                    "eos_actions_in_mask_pad_equals_eos": masks["eos_kept_pad_is_eos"], "finished_responses": masks["finished"]},
        "headline": {"what": f"decoding steps per batch of {max(costs)} rollouts", "unit": "steps",
                     "bug": bug["decode_steps"], "fix": fix["decode_steps"]},
    }
