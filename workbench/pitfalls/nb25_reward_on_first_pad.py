"""Pitfall P25: PPO puts the sequence score on the first PAD after the EOS instead of on the EOS.

PPO for LMs turns a scalar score into a per-token reward: zeros everywhere, the score on the last
action, the EOS. TRL's PPO trainer (``PPOv2Trainer``, later ``trl.experimental.ppo``) found the
EOS as ``sequence_lengths = first_true_indices(response == pad) − 1`` and then wrote the score at
``sequence_lengths + 1`` when that index exists — the first pad (TRL #1893 in 2024, #3750 in
2025; PR #5338 proposed ``actual_end = sequence_lengths``). A row that fills the whole response
length has no pad and keeps its score on its last token.

What the misplaced score does depends on the advantage estimator:

* **GAE over every position** (TRL: values kept up to the first pad, rewards not masked): the pad's
  δ = score flows back to the EOS discounted once more, so every real token's advantage gets
  γλ·score instead of score (with a critic at 0) — a silent scale on the signal, 0.95 at γ = 1, λ = 0.95.
* **GAE over real tokens** (``losses.gae`` here, verl's masks): the pad is masked, its reward
  zeroed, and the score never reaches the advantages at all: only the KL term trains.

The fix: the score on the last real token (``PPOConfig.reward_position="eos"``, the default here).
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import losses
from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts, score_responses
from workbench.trainers.ppo import REWARD_POSITIONS, last_token_rewards, reward_index
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars

ESTIMATORS = ("every position", "real tokens")  # GAE as TRL ran it, GAE masked to the response


# ---- measurements --------------------------------------------------------------------------------
def reward_offsets(mask: torch.Tensor, position: str) -> torch.Tensor:
    """(B,) index of the rewarded token minus the index of the last real token (the EOS): 0 is right."""
    return reward_index(mask, position) - reward_index(mask, "eos")


def advantages(scores, mask, position: str, estimator: str, *, gamma: float = 1.0, lam: float = 0.95, values=None):
    """GAE advantages on the real tokens for the score placed at ``position``.

    ``estimator="real tokens"``: ``losses.gae`` with the response mask (a masked reward is dropped).
    ``"every position"``: TRL's way — the reward tensor unmasked, GAE over the whole width with the
    values kept up to the first pad and zero after it, advantages then zeroed on pads.
    ``values`` default to 0 (a fresh critic), so an advantage reads as the share of the score it carries.
    """
    mask = mask.float()
    values = torch.zeros_like(mask) if values is None else values
    if estimator == "real tokens":
        return losses.gae(last_token_rewards(scores, mask, position), values, mask, gamma, lam)[0]
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(mask.shape[0]), reward_index(mask, position)] = scores.float()
    through_first_pad = torch.zeros_like(mask)
    through_first_pad[torch.arange(mask.shape[0]), reward_index(mask, "first_pad")] = 1
    kept = torch.maximum(mask, through_first_pad)
    out = losses.gae(rewards, values * kept, torch.ones_like(mask), gamma, lam)[0]
    return out * mask


def eos_share(scores, mask, position: str, estimator: str, **kw) -> float:
    """Mean over rows with a pad after their EOS of A(EOS) / score: 1 when the EOS carries the whole score."""
    padded = mask.sum(-1) < mask.shape[-1]
    nonzero = padded & (scores != 0)
    if not nonzero.any():
        return float("nan")
    a = advantages(scores, mask, position, estimator, **kw)
    at_eos = a[torch.arange(mask.shape[0]), reward_index(mask, "eos")]
    return float((at_eos[nonzero] / scores[nonzero]).mean())


@torch.no_grad()
def sampled_batch(model, tokenizer, problems, seed: int = 0, max_new_tokens: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, response_mask)`` of one response per problem sampled from ``model``, scores in {−1, +1}
    (task reward 2r − 1, so every row carries a non-zero score)."""
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    scores = score_responses(tokenizer, problems, rollout.response_ids, rollout.response_mask, rollout.finished)
    return 2 * scores.float() - 1, rollout.response_mask


def placement(scores, mask, gamma: float = 1.0, lam: float = 0.95) -> dict:
    """Offsets and EOS shares on one batch, per reward position."""
    full = int((mask.sum(-1) == mask.shape[-1]).sum())
    out = {"rows": mask.shape[0], "full_length_rows": full}
    for position in REWARD_POSITIONS:
        offsets = reward_offsets(mask, position)
        out[position] = {"offsets": {str(k): int((offsets == k).sum()) for k in sorted(set(offsets.tolist()))},
                         **{f"eos_share, GAE over {e}": eos_share(scores, mask, position, e, gamma=gamma, lam=lam)
                            for e in ESTIMATORS}}
    return out


# ---- sweeps --------------------------------------------------------------------------------------
def lambda_sweep(scores, mask, lams: list[float], gamma: float = 1.0) -> list[dict]:
    """A(EOS)/score per λ: the fix, and the bug under both estimators."""
    rows = []
    for lam in lams:
        row = {"lam": lam, "gamma": gamma, "fix": eos_share(scores, mask, "eos", "real tokens", gamma=gamma, lam=lam)}
        for estimator in ESTIMATORS:
            row[f"bug, GAE over {estimator}"] = eos_share(scores, mask, "first_pad", estimator, gamma=gamma, lam=lam)
        rows.append(row)
    return rows


# ---- verdict -------------------------------------------------------------------------------------
def verdict(batch: dict, *, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``placement``.

    Reproduced: every row with a pad gets its score one token late (offset +1) and the EOS carries
    less than the whole score under one estimator at least (masked GAE drops it; TRL's discounts it
    by γλ); fixed: every offset is 0 and the EOS carries the whole score (within ``tolerance``).
    """
    padded = batch["rows"] - batch["full_length_rows"]
    bug, fix = batch["first_pad"], batch["eos"]
    late = bug["offsets"].get("1", 0) == padded
    reproduced = padded > 0 and late and any(bug[f"eos_share, GAE over {e}"] < 1 - tolerance for e in ESTIMATORS)
    fixed = set(fix["offsets"]) == {"0"} and all(abs(fix[f"eos_share, GAE over {e}"] - 1) < tolerance for e in ESTIMATORS)
    return reproduced, fixed


def not_shown(batch: dict) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when every sampled response runs to ``max_new_tokens``
    (an untrained checkpoint rarely emits EOS), no row has a pad for the score to land on."""
    if batch["rows"] > batch["full_length_rows"]:
        return None
    return (f"none of the {batch['rows']} sampled responses stopped before the token budget, so no row has a first pad "
            "for the score to land on (an untrained checkpoint rarely emits EOS); use a trained checkpoint or a longer budget")


# ---- figures -------------------------------------------------------------------------------------
CURVES = (("fix (score on EOS)", "s-", plots.FIX_COLOR), ("bug, GAE over every position (TRL)", "o--", plots.BUG_COLOR),
          ("bug, GAE over real tokens", "^:", plots.NEUTRAL_COLOR))  # the third series: a second bug, in the neutral grey


def plot_example(ax, score: float = 1.0, length: int = 4, width: int = 7, gamma: float = 1.0, lam: float = 0.95) -> dict:
    """One response of ``length`` tokens padded to ``width``: the advantage per position, fix vs both bugs."""
    mask = (torch.arange(width) < length).float()[None]
    scores = torch.tensor([score])
    x = torch.arange(width)
    curves = {"fix (score on EOS)": advantages(scores, mask, "eos", "real tokens", gamma=gamma, lam=lam)[0],
              "bug, GAE over every position": advantages(scores, mask, "first_pad", "every position", gamma=gamma, lam=lam)[0],
              "bug, GAE over real tokens": advantages(scores, mask, "first_pad", "real tokens", gamma=gamma, lam=lam)[0]}
    for a, (label, style, color) in zip(curves.values(), CURVES, strict=True):
        ax.plot(x, a, style, color=color, label=label, ms=5)
    ax.axvline(length - 1, color=plots.EOS_COLOR, lw=1, label="EOS")
    if width > length:
        ax.axvspan(length - 0.5, width - 0.5, color="0.9", zorder=0, label="pads (masked)")
    plots.integer_axis(ax.xaxis)
    ax.set_xlabel("response position")
    ax.set_ylabel("advantage")
    ax.set_title(f"one response: {length} tokens, {width - length} pads", fontsize=10)
    return {k: v.tolist() for k, v in curves.items()}


def plot_lambda(ax, rows: list[dict]) -> None:
    """A(EOS)/score vs λ on the sampled batch: the fix is 1, the bug γλ or 0."""
    lams = [r["lam"] for r in rows]
    for key, (label, style, color) in zip(("fix", "bug, GAE over every position", "bug, GAE over real tokens"), CURVES, strict=True):
        ax.plot(lams, [r[key] for r in rows], style, color=color, label=label, ms=4)
    ax.set_xlabel(f"GAE λ (γ = {rows[0]['gamma']:g})")
    ax.set_ylabel("A(EOS) / score")
    ax.set_ylim(-0.05, 1.1)
    ax.set_title("padded rows of the batch", fontsize=10)


def plot_offsets(ax, batch: dict) -> None:
    """Rows per offset (rewarded index − EOS index), per position."""
    keys = sorted({int(k) for p in REWARD_POSITIONS for k in batch[p]["offsets"]})
    for j, (position, color) in enumerate(zip(REWARD_POSITIONS, (plots.FIX_COLOR, plots.BUG_COLOR), strict=True)):
        bars = ax.bar([k + (j - 0.5) * 0.35 for k in keys], [batch[position]["offsets"].get(str(k), 0) for k in keys], 0.35,
                      color=color, label=f"score on {'EOS' if position == 'eos' else 'first pad'}")
        label_zero_bars(ax, bars)
    ax.set_xticks(keys)
    ax.set_xlabel("rewarded − EOS index")
    ax.set_ylabel("responses")
    ax.set_title(f"sampled batch ({batch['rows']} responses)", fontsize=10)


def figure_reward_position(batch: dict, rows: list[dict], gamma: float = 1.0, lam: float = 0.95):
    """The notebook's figure: one example's advantages, the offsets on the batch, A(EOS)/score vs λ; one legend under
    them (``reward_position_note`` is the caption)."""
    fig = plots.figure_panels((plots.NOTEBOOK_WIDTH, 3.0), lambda ax: plot_example(ax, gamma=gamma, lam=lam),
                              lambda ax: plot_offsets(ax, batch), lambda ax: plot_lambda(ax, rows))
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=9)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def placement_lines(batch: dict, rows: list[dict]) -> str:
    lines = [f"{batch['rows']} sampled responses, {batch['full_length_rows']} fill the whole length (no pad)"]
    for position in REWARD_POSITIONS:
        b = batch[position]
        lines.append(f"score at {position}: offsets {b['offsets']}; A(EOS)/score "
                     + ", ".join(f"GAE over {e} {b[f'eos_share, GAE over {e}']:.3f}" for e in ESTIMATORS))
    lines += [f"λ={r['lam']:.2f}: fix {r['fix']:.3f}, bug (every position) {r['bug, GAE over every position']:.3f}, "
              f"bug (real tokens) {r['bug, GAE over real tokens']:.3f}" for r in rows]
    return "\n".join(lines)


def reward_position_note(batch: dict, rows: list[dict], gamma: float = 1.0, lam: float = 0.95) -> str:
    """The caption printed under ``figure_reward_position``: what each panel draws, in words the labels leave out."""
    return (f"Left: the advantage per position of one response of 4 tokens and 3 pads with score 1 and a critic at 0 "
            f"(γ = {gamma:g}, λ = {lam:g}): at the EOS it is the score with the fix, γλ × the score when the score sits on the "
            f"first pad and GAE runs over every position (TRL), 0 when GAE is masked to the real tokens. Middle: the "
            f"rewarded index minus the EOS index of each of the {batch['rows']} sampled responses ({batch['full_length_rows']} "
            f"fill the whole length: no pad, their score stays on the last token). Right: A(EOS) / score, mean over the "
            f"padded responses, for each GAE λ (γ = {rows[0]['gamma']:g}).")


def headline_sentence(batch: dict) -> str:
    reproduced, fixed = verdict(batch)
    bug, fix = batch["first_pad"], batch["eos"]
    return (f"The EOS carries {fix['eos_share, GAE over real tokens']:.2f} of the score with the fix, "
            f"{bug['eos_share, GAE over every position']:.2f} with the bug under TRL's GAE and "
            f"{bug['eos_share, GAE over real tokens']:.2f} under masked GAE: "
            + ("the misplaced score is discounted or dropped." if reproduced else "no misplacement measured.")
            + (" The fix rewards the EOS." if fixed else " The fix does not restore it."))


# ---- explorer ------------------------------------------------------------------------------------
def example_explorer(length: int = 4, width: int = 7, lam: float = 0.95) -> Explorer:
    """Sliders for the response length, the padded width and λ: one row's advantages, redrawn."""

    def draw(length, width, lam):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        curves = plot_example(ax, length=min(length, width), width=width, lam=lam)
        ax.legend(**plots.LEGEND_RIGHT)
        return curves

    controls = {"length": widgets.IntSlider(value=length, min=1, max=16, description="length"),
                "width": widgets.IntSlider(value=width, min=1, max=16, description="width"),
                "lam": widgets.FloatSlider(value=lam, min=0.0, max=1.0, step=0.05, description="λ")}
    return Explorer(controls, draw, title="P25: advantages with the score on the EOS vs on the first pad")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(batch: dict, rows: list[dict]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 25."""
    reproduced, fixed = verdict(batch)
    return dict(
        notebook="25_reward_on_first_pad", reproduced=reproduced, fixed=fixed, not_shown=not_shown(batch),
        metrics={"placement": batch, "lambda_sweep": rows},
        headline={"what": "share of the score the EOS token's advantage carries (TRL-style GAE, critic at 0)", "unit": "share",
                  "bug": batch["first_pad"]["eos_share, GAE over every position"], "fix": batch["eos"]["eos_share, GAE over real tokens"]},
    )
