"""Pitfall P16: group statistics — a one-pass std in finite precision, and groups found by a fixed stride.

GRPO-style advantages divide each reward's distance to its group's baseline by the group's std.
Two ways to get the statistics wrong, both reported in 2025–2026:

**One-pass std.** std = sqrt(E[x²] − E[x]²) subtracts two nearly equal numbers. For a group of equal
rewards the exact answer is 0, but E[x²] and E[x]² are each rounded, so the difference is a rounding
residue (≈ 1e-7 in fp32 for 0.95, i.e. a std ≈ 4.6e-4). NeMo-RL (#1518, fix PR #1519) computes the
leave-one-out baseline and std this way: in a group [0, 0.95 × 7] the sample with reward 0 sees seven
equal rewards, a residue std of 4.6e-4 passes the "std > 0" test, and its advantage is
−0.95 / 4.6e-4 ≈ −2075 instead of −0.95. The error of the one-pass form grows as
ε_dtype · E[x²] / var(x): in bf16 (ε = 2⁻⁸) it is useless for any group whose spread is small next to
its mean.

**Two-pass std alone is not the fix.** Subtracting the mean first (Σ(x − x̄)² / (n − 1)) leaves a
smaller residue (6.4e-8 here, because x̄ of seven 0.95s is not exactly 0.95 in fp32), and dividing by
6.4e-8 + ε is worse. The fix is a floor: where the group std is below ``floor`` (rewards are O(1); a
std of 1e-3 carries no signal) do not divide — the advantage is the centred reward, ≈ 0 for an
all-equal group and −0.95 for the singleton above.

**Fixed stride.** Rewards laid out group after group are cut every ``group_size`` rows. When a rollout
fails and its group keeps only its survivors (AReaL #1419, fix PR #1454; slime #1414), every later
slice straddles two prompts, and the tail rows past the last full slice keep mean 0, std 0: they are
divided by ε. The fix: explicit group ids (statistics per id, by scatter), whatever the group sizes.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.modeling.rollout import sample
from workbench.tasks import decode_responses, encode_prompts, reward
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import draw_floor, label_zero_bars, note_coinciding


# ---- measurements -------------------------------------------------------------------------------
def one_pass_std(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """sqrt((E[x²] − E[x]²) · n / (n − 1)) over the last dim, computed in ``dtype`` (the bug)."""
    x = x.to(dtype)
    n = x.shape[-1]
    variance = ((x * x).mean(-1) - x.mean(-1) ** 2) * (n / max(n - 1, 1))
    return variance.clamp_min(0).sqrt().float()


def two_pass_std(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """sqrt(Σ(x − x̄)² / (n − 1)) over the last dim, computed in ``dtype``."""
    x = x.to(dtype)
    n = x.shape[-1]
    centred = x - x.mean(-1, keepdim=True)
    return ((centred * centred).sum(-1) / max(n - 1, 1)).sqrt().float()


STD_FUNCTIONS = {"one-pass": one_pass_std, "two-pass": two_pass_std}


def leave_one_out_stats(rewards: torch.Tensor, std: str = "one-pass", dtype: torch.dtype = torch.float32):
    """For each sample of one group, the mean and std of the *other* samples: ``(baseline, std)``."""
    n = rewards.shape[-1]
    others = torch.stack([torch.cat([rewards[:i], rewards[i + 1 :]]) for i in range(n)])
    return others.to(dtype).mean(-1).float(), STD_FUNCTIONS[std](others, dtype)


def normalise(centred: torch.Tensor, std: torch.Tensor, *, eps: float = 1e-6, floor: float = 0.0) -> torch.Tensor:
    """centred / (std + ε) where std > ``floor``, the centred value undivided elsewhere.

    ``floor=0`` is the "skip a zero std" guard (NeMo-RL after PR #1519): a rounding residue passes it.
    ``floor=1e-3`` is the fix: a std that small carries no signal, whatever its origin.
    """
    return torch.where(std <= floor, centred, centred / (std + eps))


def loo_advantages(rewards: torch.Tensor, *, std: str = "one-pass", floor: float = 0.0, eps: float = 1e-6,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """NeMo-RL-style advantages of one group: (R_i − mean of the others) / (std of the others + ε),
    left undivided where that std is ≤ ``floor``."""
    baseline, spread = leave_one_out_stats(rewards, std, dtype)
    return normalise(rewards.float() - baseline, spread, eps=eps, floor=floor)


def stride_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """The bug: groups recovered by slicing every ``group_size`` rows; rows past the last full slice
    keep mean 0 and std 0 (AReaL before PR #1454)."""
    out = rewards.float() / eps  # the tail: (x − 0) / (0 + ε)
    for start in range(0, rewards.numel() - group_size + 1, group_size):
        chunk = rewards[start : start + group_size].float()
        out[start : start + group_size] = (chunk - chunk.mean()) / (chunk.std() + eps)
    return out


def grouped_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-6, floor: float = 1e-3) -> torch.Tensor:
    """The fix: per-group mean and two-pass std found by explicit ``group_ids`` (any sizes, any order),
    std below ``floor`` (or a group of one) → the centred reward, undivided."""
    rewards = rewards.float()
    ids = torch.unique(group_ids, return_inverse=True)[1]
    count = torch.zeros(int(ids.max()) + 1).index_add_(0, ids, torch.ones_like(rewards))
    mean = torch.zeros_like(count).index_add_(0, ids, rewards) / count
    centred = rewards - mean[ids]
    variance = torch.zeros_like(count).index_add_(0, ids, centred**2) / (count - 1).clamp_min(1)
    return normalise(centred, variance.sqrt()[ids], eps=eps, floor=floor)


@torch.no_grad()
def sample_group_rewards(model, tokenizer, problems, group_size: int, seed: int = 0, max_new_tokens: int = 4) -> torch.Tensor:
    """(n_problems, group_size) task rewards of responses sampled from ``model``."""
    repeated = [p for p in problems for _ in range(group_size)]
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in repeated])
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    texts = decode_responses(tokenizer, rollout.response_ids, rollout.response_mask)
    values = [reward(t, bool(f), p) for t, f, p in zip(texts, rollout.finished.tolist(), repeated, strict=True)]
    return torch.tensor(values).view(len(problems), group_size)


def partial_groups(rewards: torch.Tensor, drop_prob: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop each rollout with probability ``drop_prob`` (a failed episode), keeping the survivors of each
    group in place: ``(flat_rewards, group_ids)``."""
    keep = torch.rand(rewards.shape, generator=torch.Generator().manual_seed(seed)) >= drop_prob
    group_ids = torch.arange(rewards.shape[0])[:, None].expand_as(rewards)
    return rewards[keep], group_ids[keep]


def misgrouping(rewards: torch.Tensor, group_ids: torch.Tensor, group_size: int, eps: float = 1e-6) -> dict:
    """Stride grouping vs explicit ids on the same flat batch."""
    bug, fix = stride_advantages(rewards, group_size, eps), grouped_advantages(rewards, group_ids, eps=eps)
    n = rewards.numel()
    wrong = torch.ones(n, dtype=torch.bool)  # tail rows are never grouped right
    for start in range(0, n - group_size + 1, group_size):
        ids = group_ids[start : start + group_size]
        whole = (ids[:, None] == group_ids[None, :]).sum(-1) == (ids[:, None] == ids[None, :]).sum(-1)
        alone = (ids == ids[:, None]).all(-1)
        wrong[start : start + group_size] = ~(whole & alone)  # the slice is not exactly the row's whole group
    return {"samples": n, "misgrouped_fraction": float(wrong.float().mean()), "max_abs_advantage_bug": float(bug.abs().max()),
            "max_abs_advantage_fix": float(fix.abs().max()), "mean_abs_difference": float((bug - fix).abs().mean()),
            "sign_disagreement": float(((bug.sign() != fix.sign()) & (fix != 0)).float().mean()),
            "max_abs_group_mean_fix": float(max(fix[group_ids == g].mean().abs() for g in group_ids.unique()))}


# ---- sweeps -------------------------------------------------------------------------------------
def singleton_sweep(values: list[float], group_size: int = 8, eps: float = 1e-6, floor: float = 1e-3) -> list[dict]:
    """Group [0, v × (group_size − 1)] with a leave-one-out baseline: the advantage of the sample with
    reward 0 (exact: −v) for one-pass, two-pass, and two-pass with the floor, all in fp32; and the statistics of
    the others it sees, ``group_size − 1`` equal rewards: both stds and E[x²] − E[x]² (0 in exact arithmetic)."""
    rows = []
    for v in values:
        rewards = torch.tensor([0.0] + [v] * (group_size - 1))
        baseline, one_pass = leave_one_out_stats(rewards, "one-pass")
        _, two_pass = leave_one_out_stats(rewards, "two-pass")
        centred, others = rewards.float() - baseline, rewards[1:]
        rows.append({"value": v,
                     "one-pass": float(normalise(centred, one_pass, eps=eps)[0]),
                     "two-pass": float(normalise(centred, two_pass, eps=eps)[0]),
                     "two-pass + floor": float(normalise(centred, two_pass, eps=eps, floor=floor)[0]),
                     "one-pass std": float(one_pass[0]), "two-pass std": float(two_pass[0]),
                     "E[x²] − E[x]²": float((others * others).mean() - others.mean() ** 2)})
    return rows


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def precision_sweep(spreads: list[float], mean: float = 1.0, n: int = 8, seed: int = 0) -> dict:
    """Relative error of each std in each dtype for groups μ + s·z (z fixed, standard normal), against
    the float64 std of the same (dtype-rounded) values. ``{"<method> <dtype>": [error per spread]}``."""
    z = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out = {}
    for method, fn in STD_FUNCTIONS.items():
        for name in ("float32", "bfloat16"):
            errors = []
            for s in spreads:
                x = (mean + s * z).to(DTYPES[name])
                exact = x.double().std()
                errors.append(float((fn(x, DTYPES[name]).double() - exact).abs() / exact))
            out[f"{method} {name}"] = errors
    return out


def partial_group_sweep(rewards: torch.Tensor, drop_probs: list[float], group_size: int, seed: int = 0) -> list[dict]:
    """``misgrouping`` after dropping rollouts with each probability (one drop pattern per probability)."""
    rows = []
    for i, p in enumerate(drop_probs):
        flat, ids = partial_groups(rewards, p, seed=seed + i)
        rows.append({"drop_prob": p, **misgrouping(flat, ids, group_size)})
    return rows


def headline_rows(singleton: list[dict], partial: list[dict]) -> tuple[dict, dict]:
    """The singleton row nearest v = 0.95 and the most mis-grouped partial-group row."""
    return min(singleton, key=lambda r: abs(r["value"] - 0.95)), max(partial, key=lambda r: r["misgrouped_fraction"])


# ---- verdict ------------------------------------------------------------------------------------
def verdict(singleton: dict, partial: dict, *, floor_tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from one ``singleton_sweep`` row and one ``misgrouping`` result.

    Reproduced: the one-pass singleton advantage is over 10× its exact value −v, and the stride
    grouping mis-groups samples; fixed: the floored advantage is −v and explicit ids give zero-mean
    groups with |A| bounded by the group size.
    """
    exact = singleton["value"]
    reproduced = abs(singleton["one-pass"]) > 10 * exact and partial["misgrouped_fraction"] > 0
    fixed = abs(singleton["two-pass + floor"] + exact) < floor_tolerance and partial["max_abs_group_mean_fix"] < 1e-5
    return reproduced, fixed


# ---- figures ------------------------------------------------------------------------------------
def _legend_below(ax, ncol: int = 1) -> None:
    """Legend under the axes, where it covers no data."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=ncol, fontsize=8, frameon=False)


def _ring_hidden(ax) -> None:
    """Ring every point of a line drawn under another (``note_coinciding``), keeping the legend's labels short: the
    caption (``caption_note``) says what a ring means."""
    note_coinciding(ax, ring_only=True)


def plot_singleton(ax, rows: list[dict]) -> None:
    """|advantage| of the reward-0 sample: the headline bug is the one-pass fp32 std (vermilion, as in
    ``plot_precision``); a point hidden under another series is ringed."""
    values = [r["value"] for r in rows]
    ax.plot(values, values, ":", color=plots.NEUTRAL_COLOR, label="exact")
    styles = {"one-pass": (plots.BUG_COLOR, "o-", "one-pass (bug)"),
              "two-pass": (plots.SERIES_COLORS[2], "^--", "two-pass"),
              "two-pass + floor": (plots.FIX_COLOR, "s-", "two-pass + floor (fix)")}
    for key, (color, style, label) in styles.items():
        ax.plot(values, [abs(r[key]) for r in rows], style, color=color, label=label, ms=4)
    ax.set_yscale("log")
    ax.set_xlabel("reward v of the seven others")
    ax.set_ylabel("|A| of the reward-0 sample")
    _ring_hidden(ax)
    _legend_below(ax, ncol=2)


PRECISION_STYLES = {  # the headline bug (one-pass fp32, as in plot_singleton) and fix in their colours; bf16 dashed
    "one-pass float32": ("BUG_COLOR", "o-", " (bug)"), "one-pass bfloat16": (5, "o--", ""),
    "two-pass bfloat16": (2, "s--", ""), "two-pass float32": ("FIX_COLOR", "s-", " (fix)")}


def _dtype_label(key: str) -> str:
    return key.replace("bfloat16", "bf16").replace("float32", "fp32")


def plot_precision(ax, spreads: list[float], errors: dict, floor: float = 1e-10) -> None:
    """Relative error of the std vs the group spread; an exact zero is drawn at ``floor``, on a labelled line."""
    for key, values in errors.items():
        color, style, tag = PRECISION_STYLES.get(key, (0, "o-", ""))
        color = getattr(plots, color) if isinstance(color, str) else plots.SERIES_COLORS[color]
        ax.plot(spreads, [max(v, floor) for v in values], style, color=color, label=_dtype_label(key) + tag, ms=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    if any(v == 0 for values in errors.values() for v in values):
        draw_floor(ax, floor)
    ax.set_xlabel("group spread σ / mean")
    ax.set_ylabel("relative error of the std")
    _ring_hidden(ax)
    _legend_below(ax, ncol=2)


def plot_partial(ax, rows: list[dict]) -> None:
    """Share of samples normalised with the wrong group: stride grouping (bug) vs explicit group ids (fix,
    none by construction, labelled 0), and the share whose advantage sign differs between the two."""
    x = range(len(rows))
    ax.bar([i - 0.27 for i in x], [r["misgrouped_fraction"] for r in rows], 0.27, color=plots.BUG_COLOR,
           label="wrong group: stride (bug)")
    fix = ax.bar(list(x), [0.0 for _ in rows], 0.27, color=plots.FIX_COLOR, label="wrong group: group ids (fix)")
    label_zero_bars(ax, fix)
    ax.bar([i + 0.27 for i in x], [r["sign_disagreement"] for r in rows], 0.27, color=plots.NEUTRAL_COLOR,
           label="sign of A differs")
    for i, r in enumerate(rows):
        ax.annotate(f"{r['max_abs_advantage_bug']:.0e}", (i - 0.27, r["misgrouped_fraction"]), ha="center", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(list(x), [f"{r['drop_prob']:.0%}" for r in rows])
    ax.set_xlabel("rollouts dropped")
    ax.set_ylabel("share of samples")
    ax.set_ylim(0, 1.2 * max([r["misgrouped_fraction"] for r in rows] + [0.1]))
    plots.legend_outside(ax, "right")


def figure_group_statistics(singleton: list[dict], spreads: list[float], errors: dict, partial: list[dict]):
    """The notebook's figure: ``plot_singleton`` and ``plot_precision`` side by side, ``plot_partial`` under them."""
    fig, axes = plots.panel_grid(3, columns=2, panel_height=3.6)
    plot_singleton(axes[0], singleton)
    plot_precision(axes[1], spreads, errors)
    plot_partial(axes[2], partial)
    fig.tight_layout()
    return fig


def plot_singleton_advantages(ax, row: dict) -> None:
    """One ``singleton_sweep`` row: |advantage| of the reward-0 sample per std, against the exact |−v|."""
    keys = ("one-pass", "two-pass", "two-pass + floor")
    colors = (plots.BUG_COLOR, plots.SERIES_COLORS[2], plots.FIX_COLOR)
    values = [abs(row[k]) for k in keys] + [row["value"]]
    ax.bar(keys, values[:3], color=colors)
    ax.axhline(row["value"], color=plots.NEUTRAL_COLOR, ls=":", label=f"exact |R − baseline| = {row['value']:g}")
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) >= 8:  # a log axis only where the bars span a decade or so
        ax.set_yscale("log")
    ax.set_ylabel("|advantage| of the reward-0 sample")
    ax.legend(fontsize=8)


# ---- printers -----------------------------------------------------------------------------------
def caption_note(group_size: int, floor: float = 1e-3) -> str:
    """The caption under the figure: each panel's setting and the names its legend shortens."""
    return (f"Top left: the group [0, v × {group_size - 1}] in fp32; one-pass std = sqrt(E[x²] − E[x]²), skipping only std = 0 "
            f"(bug); two-pass std Σ(x − x̄)²/(n − 1), skipping only std = 0; two-pass with a floor, no division when std < "
            f"{floor:g} (fix); exact = |R − baseline| = v. Top right: the std's relative error against the group's spread, per "
            "algorithm and dtype. Bottom: partial groups from the tiny model's rewards: the share of samples normalised with "
            "another prompt's group (stride) or with their own (group ids: none, a written 0), the share whose advantage sign "
            "differs between the two, and above each stride bar its largest |advantage|. A ring marks a point hidden under "
            "another series.")


def cancellation_line(head: dict, group_size: int) -> str:
    """E[x²] − E[x]² of the headline group's ``group_size − 1`` equal rewards in fp32 (exactly 0 in exact arithmetic),
    with both stds (``head``: the singleton row of ``headline_rows``)."""
    return (f"{group_size - 1} rewards of {head['value']} in fp32: E[x²] − E[x]² = {head['E[x²] − E[x]²']:.2g}, "
            f"one-pass std {head['one-pass std']:.2g}, two-pass std {head['two-pass std']:.2g}")


def sweep_lines(singleton: list[dict], spreads: list[float], errors: dict, partial: list[dict]) -> str:
    lines = [f"v={r['value']:.2f}: one-pass std {r['one-pass std']:.2e} → A = {r['one-pass']:.4g}; two-pass {r['two-pass']:.4g}; "
             f"floor {r['two-pass + floor']:.4g}" for r in singleton]
    lines += [f"{key:>18}: relative std error " + ", ".join(f"{e:.1e}" for e in errs) + f" at spreads {spreads}"
              for key, errs in errors.items()]
    lines += [f"drop {r['drop_prob']:.0%}: {r['samples']} samples, {r['misgrouped_fraction']:.0%} mis-grouped, "
              f"{r['sign_disagreement']:.1%} signs flipped, max |A| stride {r['max_abs_advantage_bug']:.3g} "
              f"vs ids {r['max_abs_advantage_fix']:.3g}" for r in partial]
    return "\n".join(lines)


def headline_sentence(head: dict, worst: dict) -> str:
    """The ``headline_rows``' advantage of the reward-0 sample without and with the fix, and the verdict's reading."""
    return (f"[0, {head['value']} × 7]: A = {head['one-pass']:.1f} with the one-pass std, {head['two-pass + floor']:.4f} with the fix; "
            + ("the residue is the bug." if verdict(head, worst)[0] else "no residue at this value."))


# ---- explorer -----------------------------------------------------------------------------------
def singleton_advantage_explorer(group_size: int = 8, value: float = 0.95) -> Explorer:
    """A slider for v in the group [0, v × (group_size − 1)]: the reward-0 sample's advantage per std, redrawn."""

    def draw(v):
        row = singleton_sweep([v], group_size)[0]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        plot_singleton_advantages(ax, row)
        ax.set_title(f"group [0, {v:g} × {group_size - 1}]", fontsize=9)
        return row

    slider = widgets.FloatSlider(value=value, min=0.01, max=1.0, step=0.01, description="v")
    return Explorer({"v": slider}, draw, title="P16: the reward-0 sample's advantage, one-pass vs two-pass std")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(singleton: list[dict], errors: dict, partial: list[dict], head: dict, worst: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 16 (``head``, ``worst``: ``headline_rows``): fixed needs
    zero-mean groups at every drop rate."""
    reproduced, fixed = verdict(head, worst)
    return dict(
        notebook="16_group_statistics",
        reproduced=reproduced, fixed=fixed and all(verdict(head, r)[1] for r in partial),
        metrics={"singleton_advantage": {str(r["value"]): {k: r[k] for k in ("one-pass", "two-pass", "two-pass + floor")}
                                         for r in singleton},
                 "std_relative_error": errors, "partial_groups": partial},
        headline={"what": f"advantage of the reward-0 sample in [0, {head['value']} × 7] (exact −{head['value']})", "unit": "advantage",
                  "bug": head["one-pass"], "fix": head["two-pass + floor"]},
    )
