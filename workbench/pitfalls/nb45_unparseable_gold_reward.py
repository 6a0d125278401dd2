"""Pitfall P45: a reward function that returns 1 when the *gold* answer cannot be parsed.

open-r1's ``accuracy_reward`` (before PR #566, March 2025; issues #86, #159, #215, #293) gave reward 1.0 to every
completion of a prompt whose gold solution ``math_verify.parse`` could not read. The maintainers' argument (PR #55,
#159): it does not matter, GRPO normalises rewards per group, an all-equal group gets advantage 0. That is half
right, and this module measures both halves on a synthetic batch (nothing is learned: correctness is drawn from a
per-prompt accuracy):

* **the logged reward is inflated** whatever the normalisation — by share × (1 − accuracy) — so a run looks better
  than it is, more so the more of the dataset fails to parse;
* **group normalisation (mean and std per group) hides it** in the gradient: every advantage equals the reference's;
* **it does not hide it** when a statistic crosses groups: TRL's ``scale_rewards="batch"`` centres on the group mean
  but divides by the std of the *raw* batch rewards, which the constant 1s change (every parseable advantage is
  rescaled); REINFORCE++-style batch normalisation (mean and std over the batch, groups of one, or a batch mixing
  datasets) gives the unparseable samples a positive advantage — whatever they wrote is reinforced — and shifts the
  baseline of all the others.

Returning 0 instead of 1 (what TRL's ``nansum`` over reward functions makes of a ``None``) moves the same error to
the other side: the logged total reward is deflated, and batch statistics still count the samples. The fix is to
*skip* them: reward ``None`` (open-r1 after PR #566), excluded from the logged mean and from every normalisation
statistic, advantage 0. The reference is the same batch without the unparseable prompts; the fix must reproduce it
exactly.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.viz import plots
from workbench.viz.explorer import Explorer

POLICIES = {"one": "reward 1 (bug)", "zero": "reward 0", "skip": "skipped (fix)"}
SCOPES = {"group": "group mean / group std", "group-batch-std": "group mean / batch std", "batch": "batch mean / batch std"}
SHORT_SCOPES = {"group": "group", "group-batch-std": "group mean,\nbatch std", "batch": "batch"}
EPS = 1e-4  # TRL's std epsilon


# ---- measurements --------------------------------------------------------------------------------
def reward_batch(n_prompts: int, group_size: int, unparseable_share: float, accuracy: float, seed: int = 0) -> dict:
    """A batch of ``n_prompts`` groups of ``group_size`` completions. Each prompt has an accuracy drawn uniformly
    around ``accuracy`` (as wide as [0, 1] allows); each completion is correct with it. ``round(share · n_prompts)`` prompts, chosen at
    random, have a gold answer that cannot be parsed."""
    if not 0 <= unparseable_share <= 1:
        raise ValueError(f"unparseable_share must be in [0, 1], got {unparseable_share}")
    if not 0 < accuracy < 1:
        raise ValueError(f"accuracy must be in (0, 1), got {accuracy}")
    if group_size < 2:
        raise ValueError(f"group_size must be ≥ 2 (a group's std needs two samples), got {group_size}")
    g = torch.Generator().manual_seed(seed)
    half = min(accuracy, 1 - accuracy)
    p = accuracy + half * (2 * torch.rand(n_prompts, generator=g) - 1)
    correct = (torch.rand(n_prompts, group_size, generator=g) < p[:, None]).float()
    bad = torch.zeros(n_prompts, dtype=torch.bool)
    bad[torch.randperm(n_prompts, generator=g)[: round(unparseable_share * n_prompts)]] = True
    return {"correct": correct, "unparseable": bad[:, None].expand(-1, group_size).clone(), "group_size": group_size}


def rewards(batch: dict, policy: str) -> torch.Tensor:
    """The accuracy reward of each completion ``[prompts, group]``: correctness where the gold parses; where it does
    not, 1 (``"one"``, open-r1 before PR #566), 0 (``"zero"``) or NaN (``"skip"``, a ``None`` reward)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
    fill = {"one": 1.0, "zero": 0.0, "skip": float("nan")}[policy]
    return torch.where(batch["unparseable"], torch.full_like(batch["correct"], fill), batch["correct"])


def logged_reward(r: torch.Tensor) -> float:
    """The reward a trainer logs: the mean over the scored completions (NaN = skipped)."""
    return float(r.nanmean())


def advantages(r: torch.Tensor, scope: str = "group", eps: float = EPS) -> torch.Tensor:
    """Advantages of rewards ``[prompts, group]``. NaN rewards are left out of every mean and std and get advantage 0.

    ``"group"``: (r − group mean) / (group std + eps), GRPO. ``"group-batch-std"``: the group mean, divided by the
    std of all the batch's rewards (TRL ``scale_rewards="batch"``). ``"batch"``: (r − batch mean) / (batch std + eps),
    REINFORCE++-style. Stds are Bessel-corrected, as ``torch.std``."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {list(SCOPES)}, got {scope!r}")
    scored = ~r.isnan()
    x = torch.where(scored, r, torch.zeros_like(r))
    n_group = scored.sum(1, keepdim=True).clamp(min=1)
    group_mean = x.sum(1, keepdim=True) / n_group
    group_var = (torch.where(scored, x - group_mean, torch.zeros_like(x)) ** 2).sum(1, keepdim=True) / (n_group - 1).clamp(min=1)
    values = x[scored]
    batch_mean, batch_std = (values.mean(), values.std()) if values.numel() > 1 else (torch.tensor(0.0), torch.tensor(0.0))
    if scope == "group":
        a = (x - group_mean) / (group_var.sqrt() + eps)
    elif scope == "group-batch-std":
        a = (x - group_mean) / (batch_std + eps)
    else:
        a = (x - batch_mean) / (batch_std + eps)
    return torch.where(scored, a, torch.zeros_like(a))


def reference(batch: dict) -> dict:
    """The same batch without the unparseable prompts: its true accuracy, and per scope its advantages scattered back
    onto the full batch's parseable positions (the rows of the unparseable prompts stay 0)."""
    keep = ~batch["unparseable"][:, 0]
    clean = batch["correct"][keep]
    out = {"accuracy": float(clean.mean()) if keep.any() else float("nan")}
    for scope in SCOPES:
        full = torch.zeros_like(batch["correct"])
        if keep.any():
            full[keep] = advantages(clean, scope)
        out[scope] = full
    return out


def batch_case(batch: dict) -> dict:
    """Every reward policy on one batch against the reference: the logged reward's error, and per normalisation the
    largest advantage error on the parseable completions and the mean advantage the unparseable ones receive."""
    ref = reference(batch)
    bad = batch["unparseable"]
    out = {"share": float(bad[:, 0].float().mean()), "accuracy": ref["accuracy"]}
    for policy in POLICIES:
        r = rewards(batch, policy)
        row = {"logged": logged_reward(r), "inflation": logged_reward(r) - ref["accuracy"]}
        for scope in SCOPES:
            a = advantages(r, scope)
            row[f"error_{scope}"] = float((a - ref[scope])[~bad].abs().max()) if (~bad).any() else 0.0
            row[f"unparseable_{scope}"] = float(a[bad].mean()) if bad.any() else 0.0
        out[policy] = row
    return out


# ---- sweeps --------------------------------------------------------------------------------------
def share_sweep(shares, *, n_prompts: int, group_size: int, accuracy: float, seed: int = 0) -> list[dict]:
    """``batch_case`` for every unparseable share, each batch drawn with the same seed (the same correctness)."""
    return [batch_case(reward_batch(n_prompts, group_size, s, accuracy, seed)) for s in shares]


def headline_row(rows: list[dict], share: float) -> dict:
    """The row whose share is closest to ``share`` (the notebook's headline)."""
    return min(rows, key=lambda r: abs(r["share"] - share))


# ---- verdict -------------------------------------------------------------------------------------
def verdict(row: dict, *, threshold: float = 0.02, tolerance: float = 1e-5) -> tuple[bool, bool]:
    """(reproduced, fixed) from a ``batch_case`` row.

    Reproduced: reward 1 inflates the logged reward by more than ``threshold`` *and* moves the advantages of the
    parseable completions under batch normalisation by more than ``threshold`` (group normalisation hiding it is
    shown, not required). Fixed: skipping logs the reference's accuracy and gives its advantages under every
    normalisation, within ``tolerance``, and 0 to the skipped completions.
    """
    bug, fix = row["one"], row["skip"]
    reproduced = bug["inflation"] > threshold and bug["error_batch"] > threshold
    fixed = abs(fix["inflation"]) <= tolerance and all(
        fix[f"error_{s}"] <= tolerance and fix[f"unparseable_{s}"] == 0.0 for s in SCOPES)
    return bool(reproduced), bool(fixed)


# ---- figures -------------------------------------------------------------------------------------
def plot_logged(ax, rows: list[dict]) -> None:
    """The logged reward vs the unparseable share, per reward policy, against the true accuracy of the parseable part."""
    x = [r["share"] for r in rows]
    ax.plot(x, [r["accuracy"] for r in rows], ":", color=plots.NEUTRAL_COLOR, lw=3, label="true accuracy")
    ax.plot(x, [r["one"]["logged"] for r in rows], "o-", color=plots.BUG_COLOR, label=POLICIES["one"])
    ax.plot(x, [r["zero"]["logged"] for r in rows], "^--", color=plots.SERIES_COLORS[0], label=POLICIES["zero"])
    ax.plot(x, [r["skip"]["logged"] for r in rows], "s-", color=plots.FIX_COLOR, ms=4, label=POLICIES["skip"])
    ax.set_xlabel("share of prompts, gold unparseable")
    ax.set_ylabel("logged mean reward")
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_advantage_error(ax, rows: list[dict]) -> None:
    """Largest advantage error on the parseable completions vs the share, reward 1 under each normalisation, and
    skipping (one line: the largest over the normalisations)."""
    x = [r["share"] for r in rows]
    for (scope, label), marker, style in zip(SCOPES.items(), plots.MARKERS, plots.LINE_STYLES, strict=False):
        ax.plot(x, [r["one"][f"error_{scope}"] for r in rows], marker=marker, ls=style, color=plots.BUG_COLOR, label=f"1, {label}")
    ax.plot(x, [max(r["skip"][f"error_{s}"] for s in SCOPES) for r in rows], "s-", color=plots.FIX_COLOR, ms=4, label="skipped, all three")
    ax.set_xlabel("share of prompts, gold unparseable")
    ax.set_ylabel("max |A − A_ref|, parseable")
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_unparseable_advantage(ax, row: dict) -> None:
    """The mean advantage the unparseable completions receive under each normalisation (bars), reward 1 vs skipped."""
    names = list(SCOPES)
    width = 0.38
    for k, (policy, color) in enumerate((("one", plots.BUG_COLOR), ("skip", plots.FIX_COLOR))):
        bars = ax.bar([i + (k - 0.5) * width for i in range(len(names))], [row[policy][f"unparseable_{s}"] for s in names],
                      width, color=color, label=POLICIES[policy])
        plots.label_zero_bars(ax, bars)
    ax.set_xticks(range(len(names)), [SHORT_SCOPES[n] for n in names])
    ax.set_ylabel("mean A, unparseable")
    ax.axhline(0, color=plots.NEUTRAL_COLOR, lw=0.8)
    ax.legend(**plots.legend_outside(ax))


def figure_unparseable(rows: list[dict], head: dict):
    fig, axes = plots.panel_grid(3, columns=2, panel_height=3.6)
    plot_logged(axes[0], rows)
    plot_advantage_error(axes[1], rows)
    plot_unparseable_advantage(axes[2], head)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def share_lines(rows: list[dict]) -> str:
    return "\n".join(
        f"share {r['share']:.2f}: logged reward {r['one']['logged']:.3f} (1) / {r['zero']['logged']:.3f} (0) / "
        f"{r['skip']['logged']:.3f} (skip), true {r['accuracy']:.3f}; max |ΔA| with 1: group {r['one']['error_group']:.2g}, "
        f"group/batch std {r['one']['error_group-batch-std']:.3f}, batch {r['one']['error_batch']:.3f}" for r in rows)


def headline_sentence(row: dict) -> str:
    """The headline share's numbers and the verdict's reading."""
    reproduced, fixed = verdict(row)
    bug = row["one"]
    return (f"{row['share']:.0%} of prompts unparseable: the logged reward reads {bug['logged']:.3f} for a true accuracy of "
            f"{row['accuracy']:.3f} (+{bug['inflation']:.3f}); group normalisation hides it in the gradient (max |ΔA| "
            f"{bug['error_group']:.1g}), batch normalisation does not (max |ΔA| {bug['error_batch']:.3f} on the parseable "
            f"completions, mean A {bug['unparseable_batch']:+.3f} on the unparseable ones); "
            + ("reproduced" if reproduced else "not reproduced at these settings")
            + ("; skipping matches the batch without them." if fixed else "; skipping does NOT match the reference."))


def unparseable_note(rows: list[dict], head: dict, n_prompts: int, group_size: int) -> str:
    """The caption of the figure."""
    return (f"{n_prompts} prompts × {group_size} completions, the same correctness at every share. Left: the logged mean "
            "reward with the unparseable completions rewarded 1, 0 or skipped, against the accuracy on the parseable "
            "prompts (dotted). Middle: the largest advantage error on parseable completions against the batch without "
            "the unparseable prompts, per normalisation (group mean/std: GRPO; group mean, batch std: TRL "
            "scale_rewards=\"batch\"; batch mean/std: REINFORCE++). Right: at share "
            f"{head['share']:.2f}, the mean advantage the unparseable completions receive.")


# ---- explorer ------------------------------------------------------------------------------------
def unparseable_explorer(n_prompts: int = 32, group_size: int = 8, seed: int = 0) -> Explorer:
    """Sliders for the unparseable share and the policy's accuracy, a choice of normalisation: the advantages of the
    parseable completions with reward 1 against the reference's."""

    def draw(share, accuracy, scope):
        batch = reward_batch(n_prompts, group_size, share, accuracy, seed)
        ref = reference(batch)[scope]
        bug = advantages(rewards(batch, "one"), scope)
        fix = advantages(rewards(batch, "skip"), scope)
        keep = ~batch["unparseable"]
        fig, ax = plt.subplots(figsize=(6, 3.8))
        ax.plot(ref[keep], bug[keep], "o", color=plots.BUG_COLOR, ms=4, label=POLICIES["one"])
        ax.plot(ref[keep], fix[keep], "s", color=plots.FIX_COLOR, ms=3, label=POLICIES["skip"])
        ax.set_xlabel("reference advantage")
        ax.set_ylabel("advantage")
        ax.set_title(SCOPES[scope], fontsize=9)
        plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax, "right"))
        fig.tight_layout()
        return batch_case(batch)

    controls = {"share": widgets.FloatSlider(value=0.25, min=0.0, max=0.75, step=0.05, description="unparseable"),
                "accuracy": widgets.FloatSlider(value=0.3, min=0.05, max=0.95, step=0.05, description="accuracy"),
                "scope": widgets.Dropdown(options=[(v, k) for k, v in SCOPES.items()], value="batch", description="normalise")}
    return Explorer(controls, draw, title="P45: unparseable gold answers rewarded 1")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], head: dict, settings: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 45."""
    reproduced, fixed = verdict(head)
    every = all(verdict(r)[1] for r in rows)
    return dict(
        notebook="45_unparseable_gold_reward", reproduced=reproduced, fixed=fixed and every,
        metrics={"by_share": rows, "settings": settings},
        headline={"what": f"logged reward − true accuracy, {head['share']:.0%} of gold answers unparseable", "unit": "reward",
                  "bug": head["one"]["inflation"], "fix": head["skip"]["inflation"]},
    )
