"""Pitfall P11: truncated responses (no EOS) scored as if finished.

A response cut at ``max_new_tokens`` never produced EOS. A reward function that only reads the text
rewards a truncated response whose prefix looks right as if it had finished. In GRPO the reward
becomes an advantage A_i = (R_i − mean_group R) / std_group R, so a rewarded truncated response gets
A_i > 0: the update raises the probability of *not* stopping. The switches live in the GRPO trainer
(``score_truncated_as_finished`` = the bug; the fixes: zero reward without EOS — the default —,
``mask_truncated_completions`` (TRL), ``missing_eos_penalty`` (TRL; DAPO's overlong shaping)).

``budget_profile`` says what a budget cuts on a task before anything is sampled: the share of the supervised
responses that do not fit with their EOS, and how many of those the task's reward pays when cut there and scored as
finished (what the bug can pay). On ``arith`` a budget of 3 cuts the 3-character answers right after their last
digit; on ``restate`` (answers restated 0–3 times, a reward that reads the first answer) a budget of 8 cuts a 2–3
character answer restated twice or more, long after it was stated. ``pressure`` measures the mechanism on sampled
batches before any update: in groups that mix truncated and
finished responses, how much more in-loss advantage the truncated ones get than their finished
siblings. Positive: the loss pushes towards truncation; ≤ 0: it does not. ``comparison.train_variants`` runs the variants
and ``plot_training_bands`` draws them.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import losses, progress
from workbench.experiments import comparison, statistics
from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts, encode_response, reward, score_responses
from workbench.viz import plots
from workbench.viz.explorer import Explorer

BUG = "scored as finished (bug)"
REFERENCE = "zero reward without EOS"


# ---- measurements -------------------------------------------------------------------------------
def budget_profile(tokenizer, problems, max_new_tokens: int) -> dict:
    """What ``max_new_tokens`` cuts among the supervised responses (``problem.answer``) of ``problems``:

    * ``cut`` — the share whose tokens and EOS do not fit;
    * ``paid`` — of those, the share whose first ``max_new_tokens`` tokens the task's reward pays when scored as
      finished (a truncated copy of a right response: what the bug can reward);
    * ``went_on`` — of those paid, the share with a shorter prefix the reward already pays as finished: the response
      had stated a right answer and could have stopped there, so rewarding it rewards *not stopping* (on ``arith`` the
      cut falls inside or right at the end of the only answer: 0);
    * ``unfinishable`` — of all problems, the share with no right response that fits with its EOS (no prefix of at
      most ``max_new_tokens − 1`` tokens is paid as finished): under "zero reward without EOS" such a problem can
      earn nothing at all, under the bug its cut answer is paid — a difference that is not about stopping;
    * ``problems`` — how many were read. ``cut``, ``paid`` and ``went_on`` are NaN when there is nothing to count."""
    if not problems:
        raise ValueError("budget_profile needs at least one problem")
    cut = paid = went_on = unfinishable = 0
    for problem in problems:
        ids = encode_response(tokenizer, problem.answer, add_eos=False)

        def paid_as_finished(k: int, ids=ids, problem=problem) -> bool:
            return reward(tokenizer.decode(ids[:k], skip_special_tokens=True), True, problem) > 0

        stops_right = any(paid_as_finished(k) for k in range(1, min(len(ids), max_new_tokens - 1) + 1))
        unfinishable += not stops_right
        if len(ids) + 1 <= max_new_tokens:
            continue
        cut += 1
        if paid_as_finished(max_new_tokens):
            paid += 1
            went_on += stops_right
    nan = float("nan")
    return {"problems": len(problems), "cut": cut / len(problems), "paid": paid / cut if cut else nan,
            "went_on": went_on / paid if paid else nan, "unfinishable": unfinishable / len(problems)}


@torch.no_grad()
def pressure(model, tokenizer, problems, switches: dict[str, dict], *, max_new_tokens: int, num_generations: int = 8,
             scale_rewards: str = "group", seed: int = 0, batches: int = 1) -> dict[str, dict]:
    """Per variant, over ``batches`` sampled batches of groups (sampling seeds ``seed`` … ``seed + batches − 1``):
    truncated responses, how many are rewarded (``truncated_rewarded``; ``truncated_rewarded_mixed``: those in mixed
    groups), and the *pressure*: in groups holding both truncated and finished responses, the mean in-loss advantage
    of the truncated ones minus that of their finished siblings (> 0: the update favours not stopping);
    ``group_gaps`` holds that gap per mixed group.

    Group advantages sum to 0, so a group whose responses are all truncated (or all finished) exerts no
    pressure either way; only mixed groups can, and their count is reported. More batches, more mixed
    groups: the verdict's standard error is taken over them. A bar counts the batches (hidden in batch runs)."""
    prompts = [p for p in problems for _ in range(num_generations)]
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in prompts])
    out = {label: {"truncated": 0, "truncated_rewarded": 0, "truncated_rewarded_mixed": 0, "mixed_groups": 0, "group_gaps": []}
           for label in switches}
    for b in progress.track(range(batches), "step-0 batches, sampled and scored", unit="batch"):
        r = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed + b))
        truncated = ~r.finished
        groups = truncated.view(-1, num_generations)
        mixed = groups.any(1) & (~groups).any(1)
        for label, s in switches.items():
            finished_for_scoring = torch.ones_like(r.finished) if s.get("score_truncated_as_finished") else r.finished
            rewards = score_responses(tokenizer, prompts, r.response_ids, r.response_mask, finished_for_scoring)
            rewards = rewards - s.get("missing_eos_penalty", 0.0) * truncated.float()
            advantages = losses.group_advantages(rewards, num_generations, scale_rewards)
            in_loss = (~truncated).float() if s.get("mask_truncated_completions") else torch.ones_like(advantages)
            weighted = (advantages * in_loss).view(-1, num_generations)
            o = out[label]
            o["group_gaps"] += [float(w[g].mean() - w[~g].mean()) for w, g in zip(weighted[mixed], groups[mixed], strict=True)]
            o["truncated"] += int(truncated.sum())
            rewarded = truncated & (rewards > 0)
            o["truncated_rewarded"] += int(rewarded.sum())
            o["truncated_rewarded_mixed"] += int(rewarded.view(-1, num_generations)[mixed].sum())
            o["mixed_groups"] += int(mixed.sum())
    for o in out.values():
        o["pressure"] = sum(o["group_gaps"]) / len(o["group_gaps"]) if o["group_gaps"] else 0.0
    return out


def shift(measured: dict[str, dict]) -> float:
    """How much the bug moves the pressure towards truncated responses, against scoring them 0."""
    return measured[BUG]["pressure"] - measured[REFERENCE]["pressure"]


def shift_noise(measured: dict[str, dict]) -> tuple[float, float, int]:
    """(shift, standard error, mixed groups): the shift's s.e. over the mixed groups of the batch, paired
    (bug and reference see the same groups: s.e. = std(gap_bug − gap_ref) / √n); NaN when the
    per-group gaps are absent or fewer than 2 groups are mixed."""
    bug, ref = measured[BUG].get("group_gaps"), measured[REFERENCE].get("group_gaps")
    if not bug or not ref or len(bug) != len(ref) or len(bug) < 2:
        return shift(measured), float("nan"), len(bug or [])
    d = torch.tensor(bug, dtype=torch.float64) - torch.tensor(ref, dtype=torch.float64)
    return shift(measured), float(d.std() / len(d) ** 0.5), len(d)


# ---- sweeps -------------------------------------------------------------------------------------
def variants(missing_eos_penalty: float = 0.5) -> dict[str, dict]:
    """The bug and the three fixes as GRPO config switches, keyed by label."""
    return {
        BUG: {"score_truncated_as_finished": True},
        REFERENCE: {},
        "masked out of the loss": {"mask_truncated_completions": True},
        f"penalised ({missing_eos_penalty})": {"missing_eos_penalty": missing_eos_penalty},
    }


def training_effects(runs: dict) -> dict:
    """The bug against zero reward without EOS: EOS rate and held-out accuracy."""
    return {key: statistics.effect(runs, key, BUG, REFERENCE) for key in ("finished_fraction", "heldout_accuracy")}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(measured: dict[str, dict], *, threshold: float = 0.05) -> tuple[bool, bool]:
    """(reproduced, fixed): the bug shifts the in-loss advantage towards truncated responses by more
    than ``threshold`` compared with scoring them 0 (``shift``) and, when the per-group gaps are
    measured, by more than 2 standard errors over the mixed groups (``shift_noise``: the batches
    are one sample of groups); no fix favours truncated responses over their finished siblings (pressure ≤ 0)."""
    value, se, _ = shift_noise(measured)
    reproduced = value > threshold and not value <= 2 * se  # NaN s.e. (no per-group gaps): the threshold alone
    fixed = all(m["pressure"] <= 0 for label, m in measured.items() if label != BUG)
    return bool(reproduced), bool(fixed)


def not_shown(measured: dict[str, dict]) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when no truncated response earns a reward even under the
    bug (an untrained checkpoint answers nothing right), or none that does sits in a mixed group (the only groups
    whose pressure the bug can move: in a group of truncated responses only, every advantage is relative to the
    others'), scoring truncated responses as finished moves no pressure."""
    bug = measured[BUG]
    rewarded, in_mixed = bug["truncated_rewarded"], bug.get("truncated_rewarded_mixed", bug["truncated_rewarded"])
    if in_mixed > 0:
        return None
    if rewarded == 0:
        return (f"none of the {bug['truncated']} truncated responses earns a reward even when scored as finished "
                "(an untrained checkpoint answers nothing right), so the bug changes no advantage here; use a trained one")
    return (f"{rewarded} of the {bug['truncated']} truncated responses earn a reward when scored as finished, but none "
            f"in the {bug['mixed_groups']} groups that also hold finished responses (the only ones where the bug can move "
            "the pressure), so it moves none here; use a trained checkpoint or more batches")


# Stated before any run: a rewarded truncated response gets a positive advantage, so the update raises
# the probability of not stopping and fewer responses end with EOS than when a truncated response earns nothing.
# Task: ``restate`` (docs/LEARNING.md, regime E).
PREDICTION = statistics.Prediction("finished_fraction", "share of responses ending with EOS", "-")


# ---- figures ------------------------------------------------------------------------------------
def colors(labels) -> dict[str, str]:
    palette = [plots.BUG_COLOR, plots.FIX_COLOR, plots.SERIES_COLORS[2], plots.SERIES_COLORS[3]]
    return dict(zip(labels, palette, strict=False))


TRAINING_PANELS = (("finished_fraction", "share ending with EOS"), ("reward", "reward the trainer saw"))


def plot_pressure(ax, measured: dict[str, dict]) -> None:
    """The mean in-loss advantage of truncated responses per variant (bars, value written), with each mixed
    group's own gap as a black dot: the spread the verdict's standard error comes from."""
    labels = list(measured)
    values = [measured[label]["pressure"] for label in labels]
    ax.bar(range(len(labels)), values, color=[colors(labels)[label] for label in labels], alpha=0.8)
    for i, label in enumerate(labels):
        gaps = measured[label].get("group_gaps") or []
        offsets = [0.25 * (k / max(len(gaps) - 1, 1) - 0.5) for k in range(len(gaps))]
        ax.plot([i + o for o in offsets], gaps, "o", color="black", ms=2.5, alpha=0.5, zorder=5,
                label=f"one mixed group ({len(gaps)} per variant)" if i == 0 and gaps else "_")
    if any(measured[label].get("group_gaps") for label in labels):
        ax.legend(fontsize=8)
    for i, v in enumerate(values):
        ax.text(i + 0.3, v, f"{v:+.3f}", ha="left", va="bottom" if v >= 0 else "top", fontsize=8, zorder=6,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1, "alpha": 0.8})
    ax.axhline(0, color=plots.NEUTRAL_COLOR, lw=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=15, fontsize=8)
    ax.set_ylabel("in-loss advantage: truncated − finished\n(mixed groups)")


def figure_pressure(measured: dict[str, dict]):
    fig, ax = plt.subplots(figsize=(8, 3.6))
    plot_pressure(ax, measured)
    return fig


def smoothing_window(train_steps: int) -> int:
    """The moving-average window of the training figure's bands: an eighth of the run, at least 1 step."""
    return max(1, train_steps // 8)


def plot_training_bands(axes, runs: dict, window: int) -> None:
    """EOS rate and reward bands per variant (a run hidden under another is ringed and named; legends below, where 4
    lines leave no room inside), and held-out accuracy (3 axes). Short y labels: ``training_note`` says the rest."""
    plots.plot_band_panels(axes, runs, TRAINING_PANELS, colors(runs), window=window, legend_kw=plots.LEGEND_BELOW,
                           short_labels=True)


def figure_training_bands(runs: dict, train_steps: int):
    """``plot_training_bands`` in two rows that fit a notebook (caption: ``training_note``)."""
    return plots.figure_row(lambda axes: plot_training_bands(axes, runs, window=smoothing_window(train_steps)), 3,
                            (plots.NOTEBOOK_WIDTH, 3.6), columns=2)


# ---- printers -----------------------------------------------------------------------------------
def budget_sentence(profile: dict, task: str, max_new_tokens: int) -> str:
    """``budget_profile`` in words, for the notebook's setup cell."""
    head = (f"task {task}, budget {max_new_tokens} tokens: {profile['cut']:.1%} of {profile['problems']} supervised responses "
            "do not fit with their EOS")
    if profile["cut"] > 0:
        head += (f"; {profile['paid']:.1%} of those read as right when cut there and scored as finished (what the bug can "
                 "pay)")
        if profile["paid"] > 0:
            head += (f", and {profile['went_on']:.1%} of these had stated a right answer before the cut and could have "
                     "stopped there (what makes paying them a reward for not stopping)")
    return head + (f". {profile['unfinishable']:.1%} of the problems have no right response that fits with its EOS (zero reward "
                   "without EOS gives them nothing to learn from; the bug pays their cut answers).")


def training_note(runs: dict, train_steps: int) -> str:
    """The caption printed under the training figure: what each panel shows and how its bands were made."""
    return (f"Top: the share of sampled responses that end with EOS, and the mean reward as the trainer scored it "
            f"(the bug pays truncated responses; the penalised variant subtracts its penalty) — "
            f"{plots.bands_caption(runs, smoothing_window(train_steps))}. "
            "Bottom: held-out greedy accuracy before (□) and after (●) training, dots: seeds.")


def pressure_lines(measured: dict[str, dict]) -> str:
    return "\n".join(f"{label:>26}: {m['truncated']} truncated, {m['truncated_rewarded']} rewarded, pressure {m['pressure']:+.3f}"
                     for label, m in measured.items())


def conclusion(measured: dict[str, dict]) -> str:
    """The step-0 finding in words chosen by the numbers."""
    bug, ref = measured[BUG]["pressure"], measured[REFERENCE]["pressure"]
    direction = "towards" if bug > ref else "away from"
    absolute = ("and truncated responses end up favoured over their finished siblings" if bug > 0 else
                "yet truncated responses are still disfavoured against their finished siblings (they are mostly wrong)")
    value, se, n = shift_noise(measured)
    noise = (f" ± {se:.3f} (s.e. over {n} mixed groups; "
             + ("larger than 2 s.e." if abs(value) > 2 * se else "not larger than 2 s.e.: within the sampling noise") + ")"
             if se == se else " (no noise estimate: fewer than 2 mixed groups measured)")
    return (f"{measured[BUG]['mixed_groups']} mixed groups: the bug moves the in-loss advantage {direction} truncated responses "
            f"by {bug - ref:+.3f}{noise} ({ref:+.3f} → {bug:+.3f}), {absolute}.")


# ---- explorer -----------------------------------------------------------------------------------
def eos_rate_explorer(runs: dict) -> Explorer:
    """The share of responses ending with EOS over training, one variant (first seed) at a time."""
    histories, palette = comparison.first_seed(runs), colors(runs)

    def draw(run):
        steps = [{"step": i, **h} if "step" not in h else h for i, h in enumerate(histories[run])]
        fig, ax = plt.subplots(figsize=(6, 2.5))
        plots.plot_curves(ax, {run: steps}, "finished_fraction", "share of responses ending with EOS", palette)
        return {"first": steps[0]["finished_fraction"], "last": steps[-1]["finished_fraction"]}

    return Explorer({"run": widgets.Dropdown(options=list(histories), description="run")}, draw,
                    "share of responses ending with EOS per run")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, measured: dict[str, dict], runs: dict, effects: dict, settings: dict, task: str = "arith") -> dict:
    """Notebook 11's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(measured)
    histories = comparison.first_seed(runs)
    return {
        "notebook": "11_truncated_responses", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(measured),
        "metrics": {"step0": measured,
                    "truncated_rewarded": {n: int(sum(h["truncated_rewarded"] for h in hs)) for n, hs in histories.items()},
                    "eos_rate_end": {n: statistics.tail_mean(hs, "finished_fraction") for n, hs in histories.items()},
                    "effects": {k: vars(e) for k, e in effects.items()}, "prediction": PREDICTION.record(effects, task),
                    "heldout_gain": statistics.heldout_gains(runs), "training_settings": settings},
        "headline": {"what": "step-0 pressure towards truncation: in-loss advantage of truncated − finished responses (bug vs zero reward)",
                     "unit": "advantage", "bug": measured[BUG]["pressure"], "fix": measured[REFERENCE]["pressure"]},
    }
