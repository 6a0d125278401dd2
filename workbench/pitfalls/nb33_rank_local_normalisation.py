"""Pitfall P33: token normalisation per rank in data parallelism, and clipping by a shard's local norm.

**Per-rank token mean.** A token-mean loss divides the summed token losses by the number of loss tokens.
In data parallelism each rank holds part of the batch; if each rank divides by *its own* token count and
DDP/FSDP then averages the ranks' gradients, token t on rank r weighs 1 / (W · n_r) instead of 1 / N:
tokens on a rank with short responses count more than tokens on a rank with long ones, and the ratio of
the two weights is the ratio of the ranks' token counts. prime-rl measured rank ratios of 1.02–1.04 per
step (#2358) and fixed it in PR #2562 (global token count all-reduced, FSDP's divide undone); verl PR
#5366 and torchtitan PR #2206 did the same; Megatron's ``calculate_per_token_loss`` exists for it.

**Clipping by a local norm.** With FSDP each rank owns a shard of the gradient. ``clip_grad_norm_`` on
the shard's parameters computes the shard's norm, not the model's: each rank scales its shard by a
different coefficient max_norm / ‖g_r‖, and the update's direction changes (AReaL #312; torchtitan
#766: grad norms differ across ranks; PyTorch FSDP's own ``clip_grad_norm_`` all-reduces Σ‖g_r‖²).

Both run here in real processes (``trainers.distributed.run_cpu_group``: 2 forked CPU processes, gloo).
The model is linear in its parameters θ: token t's loss is a_t · (x_t · θ), so the gradient is
Σ_t w_t a_t x_t and, with one-hot features x_t = e_t, the averaged gradient *is* each token's effective
weight w_t. The single-process token mean (w_t = 1/N) is the reference.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.trainers.distributed import run_cpu_group
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements --------------------------------------------------------------------------------
def rank_lengths(sequences_per_rank: int, short: int, imbalance: float, world_size: int = 2) -> list[list[int]]:
    """Response lengths per rank: rank 0's are ``short`` tokens, the last rank's ``short × imbalance``,
    ranks in between interpolated."""
    steps = max(world_size - 1, 1)
    return [[round(short * (1 + (imbalance - 1) * r / steps))] * sequences_per_rank for r in range(world_size)]


def token_batch(lengths: list[list[int]], dim: int, seed: int = 0, one_hot: bool = False) -> dict:
    """Features x_t (N × dim, or the N × N identity when ``one_hot``), advantages a_t and each token's rank."""
    counts = [sum(r) for r in lengths]
    n = sum(counts)
    g = torch.Generator().manual_seed(seed)
    features = torch.eye(n, dtype=torch.float64) if one_hot else torch.randn(n, dim, generator=g, dtype=torch.float64)
    advantages = torch.ones(n, dtype=torch.float64) if one_hot else torch.randn(n, generator=g, dtype=torch.float64)
    owner = torch.cat([torch.full((c,), r) for r, c in enumerate(counts)])
    return {"features": features, "advantages": advantages, "owner": owner, "counts": counts}


def loss_gradient(features: torch.Tensor, advantages: torch.Tensor, denominator: float) -> torch.Tensor:
    """∂/∂θ of Σ_t a_t (x_t · θ) / denominator, by autograd at θ = 0."""
    theta = torch.zeros(features.shape[1], dtype=features.dtype, requires_grad=True)
    ((advantages * (features @ theta)).sum() / denominator).backward()
    return theta.grad


def clip_coefficient(norm: float, max_norm: float, eps: float = 1e-6) -> float:
    """``clip_grad_norm_``'s scale: min(1, max_norm / (norm + ε))."""
    return min(1.0, max_norm / (norm + eps))


def _rank_job(rank: int, world_size: int, batches: list[dict], max_norms: list[float | None]) -> list[dict]:
    """For each batch: this rank's gradient normalised by its own token count (bug) or by the global one
    (fix), averaged over ranks like DDP; then, where the batch has a ``max_norm``, the rank's shard of the averaged
    gradient clipped by its local norm (bug) or by the all-reduced global norm (fix)."""
    out = []
    for batch, max_norm in zip(batches, max_norms, strict=True):
        mine = batch["owner"] == rank
        n_local = float(mine.sum())
        n_global = torch.tensor(n_local, dtype=torch.float64)
        torch.distributed.all_reduce(n_global)  # the fix's denominator: every rank's tokens
        row = {"rank": rank, "n_local": n_local, "n_global": float(n_global)}
        for name, denominator in (("local", n_local), ("global", float(n_global) / world_size)):
            grad = loss_gradient(batch["features"][mine], batch["advantages"][mine], denominator)
            torch.distributed.all_reduce(grad)
            row[f"grad_{name}"] = grad / world_size  # DDP's gradient: the mean over ranks
        if max_norm is None:
            out.append(row)
            continue
        shard = row["grad_global"].chunk(world_size)[rank]  # the part of the (correct) gradient this rank owns
        local_norm = float(shard.norm())
        squared = torch.tensor(local_norm**2, dtype=torch.float64)
        torch.distributed.all_reduce(squared)
        row.update(max_norm=max_norm, shard_norm=local_norm, global_norm=float(squared.sqrt()),
                   coef_local=clip_coefficient(local_norm, max_norm), coef_global=clip_coefficient(float(squared.sqrt()), max_norm))
        out.append(row)
    return out


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def summarise(lengths: list[list[int]], per_rank: list[dict], one_hot: dict, single: torch.Tensor) -> dict:
    """One batch's numbers from the ranks' rows (``per_rank[r]`` = [one-hot row, dense row]) and ``single``, the
    dense batch's gradient in one process."""
    n = one_hot["features"].shape[0]
    weights = {name: per_rank[0][0][f"grad_{name}"] for name in ("local", "global")}  # one-hot: gradient = token weights
    owner = one_hot["owner"]
    last = len(per_rank) - 1
    ratio = {name: float(w[owner == 0].mean() / w[owner == last].mean()) for name, w in weights.items()}
    rows = [rows[1] for rows in per_rank]
    single_coef = clip_coefficient(float(single.norm()), rows[0]["max_norm"])
    clipped_single = single * single_coef
    clipped = {name: torch.cat([r["grad_global"].chunk(len(rows))[r["rank"]] * r[f"coef_{name}"] for r in rows])
               for name in ("local", "global")}
    return {"tokens_per_rank": [sum(r) for r in lengths], "tokens": n,
            "weight_short_rank": {k: float(w[owner == 0].mean()) * n for k, w in weights.items()},  # in units of 1/N
            "weight_long_rank": {k: float(w[owner == last].mean()) * n for k, w in weights.items()},
            "weight_ratio": ratio,
            "grad_error": {name: _relative_error(rows[0][f"grad_{name}"], single) for name in ("local", "global")},
            "max_norm": rows[0]["max_norm"], "clip_coef_single": single_coef,
            "clip_coef_local": [r["coef_local"] for r in rows], "clip_coef_global": [r["coef_global"] for r in rows],
            "shard_norms": [r["shard_norm"] for r in rows],
            "clipped_error": {name: _relative_error(v, clipped_single) for name, v in clipped.items()}}


# ---- sweeps --------------------------------------------------------------------------------------
def measure(imbalances: list[float], *, sequences_per_rank: int = 4, short: int = 8, dim: int = 16, world_size: int = 2,
            max_norm_fraction: float = 0.5, seed: int = 0) -> list[dict]:
    """For each token-count imbalance (last rank's tokens / rank 0's), ``summarise`` of one batch, measured in
    ``world_size`` real processes; all batches run in one process group. The one-hot batch gives the token weights,
    the dense one the gradient error and the clipping, at ``max_norm_fraction`` of its one-process gradient's norm."""
    plan = []
    for imbalance in imbalances:
        lengths = rank_lengths(sequences_per_rank, short, imbalance, world_size)
        dense = token_batch(lengths, dim, seed)
        single = loss_gradient(dense["features"], dense["advantages"], dense["features"].shape[0])
        plan.append((imbalance, lengths, token_batch(lengths, dim, seed, one_hot=True), dense, single))
    batches = [b for _, _, one_hot, dense, _ in plan for b in (one_hot, dense)]
    max_norms = [m for *_, single in plan for m in (None, max_norm_fraction * float(single.norm()))]
    results = run_cpu_group(_rank_job, world_size, batches, max_norms)
    return [{"imbalance": imbalance, "processes": world_size,
             **summarise(lengths, [results[r][2 * i:2 * i + 2] for r in range(world_size)], one_hot, single)}
            for i, (imbalance, lengths, one_hot, _, single) in enumerate(plan)]


def headline_row(rows: list[dict], target: float = 2.0) -> dict:
    """The row whose imbalance is nearest ``target``."""
    return min(rows, key=lambda r: abs(r["imbalance"] - target))


# ---- verdict -------------------------------------------------------------------------------------
def verdict(row: dict, *, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed) from one ``measure`` row.

    Reproduced: per-rank normalisation weighs a short-rank token more than a long-rank one (ratio > 1 + 1e-3)
    and the gradient differs from the single-process one, and local-norm clipping scales the shards by
    coefficients that differ from the single-process one by over 1e-3. Fixed: the global denominator gives
    weight ratio 1 and the single-process gradient, and the global norm gives its clip coefficient, each
    within ``tolerance``.
    """
    reproduced = (row["weight_ratio"]["local"] > 1 + 1e-3 and row["grad_error"]["local"] > 1e-3
                  and max(abs(c - row["clip_coef_single"]) for c in row["clip_coef_local"]) > 1e-3)
    fixed = (abs(row["weight_ratio"]["global"] - 1) < tolerance and row["grad_error"]["global"] < tolerance
             and max(abs(c - row["clip_coef_single"]) for c in row["clip_coef_global"]) < tolerance)
    return reproduced, fixed


# ---- figures -------------------------------------------------------------------------------------
def plot_weights(ax, rows: list[dict]) -> None:
    """Token weight (units of 1/N) on the short and the long rank vs the imbalance, per-rank vs global."""
    x = [r["imbalance"] for r in rows]
    ax.plot(x, [r["weight_short_rank"]["local"] for r in rows], "o-", color=plots.BUG_COLOR, label="short rank (bug)")
    ax.plot(x, [r["weight_long_rank"]["local"] for r in rows], "v--", color=plots.BUG_COLOR, label="long rank (bug)")
    ax.plot(x, [r["weight_short_rank"]["global"] for r in rows], "s-", color=plots.FIX_COLOR, label="either rank (fix)")
    ax.axhline(1.0, color=plots.NEUTRAL_COLOR, ls=":", label="one process")
    ax.set_xlabel("token imbalance (long / short rank)")
    ax.set_ylabel("token weight × N")
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax, ncol=2))  # below: the lines fill the axes


def plot_clipping(ax, row: dict) -> None:
    """Each rank's clip coefficient, local shard norm (bug) vs all-reduced norm (fix), against one process's."""
    ranks = range(len(row["clip_coef_local"]))
    bug = ax.bar([r - 0.2 for r in ranks], row["clip_coef_local"], 0.4, color=plots.BUG_COLOR, label="shard's norm (bug)")
    fix = ax.bar([r + 0.2 for r in ranks], row["clip_coef_global"], 0.4, color=plots.FIX_COLOR, label="global norm (fix)")
    plots.label_zero_bars(ax, bug)
    plots.label_zero_bars(ax, fix)
    ax.axhline(row["clip_coef_single"], color=plots.NEUTRAL_COLOR, ls=":", label="one process")
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel("clip coefficient")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{row['processes']} processes, imbalance {row['imbalance']:g}")
    plots.legend_outside(ax, ncol=2)


def figure_rank_normalisation(rows: list[dict], head: dict):
    """The notebook's figure: token weights across imbalances, and the clip coefficients at the ``headline_row`` ``head``."""
    return plots.figure_panels((plots.NOTEBOOK_WIDTH, 4.2), lambda ax: plot_weights(ax, rows), lambda ax: plot_clipping(ax, head))


# ---- printers ------------------------------------------------------------------------------------
def row_lines(rows: list[dict]) -> str:
    return "\n".join(
        f"imbalance {r['imbalance']:g} (tokens per rank {r['tokens_per_rank']}): token weight × N short/long rank "
        f"{r['weight_short_rank']['local']:.3f}/{r['weight_long_rank']['local']:.3f} per-rank, "
        f"{r['weight_short_rank']['global']:.3f}/{r['weight_long_rank']['global']:.3f} global; gradient error "
        f"{r['grad_error']['local']:.2e} vs {r['grad_error']['global']:.1e}" for r in rows)


def clip_lines(row: dict) -> str:
    return (f"clip at max_norm {row['max_norm']:.4g}: one process {row['clip_coef_single']:.4f}; shard norms "
            + ", ".join(f"{v:.4g}" for v in row["shard_norms"]) + " → local coefficients "
            + ", ".join(f"{c:.4f}" for c in row["clip_coef_local"]) + " (bug), global "
            + ", ".join(f"{c:.4f}" for c in row["clip_coef_global"])
            + f" (fix); clipped-update error {row['clipped_error']['local']:.2e} vs {row['clipped_error']['global']:.1e}")


def headline_sentence(row: dict) -> str:
    """The token weights of the ``headline_row``, and the verdict's reading."""
    reproduced, fixed = verdict(row)
    return (f"a short-rank token weighs {row['weight_ratio']['local']:.3f}× a long-rank token with per-rank normalisation at "
            f"imbalance {row['imbalance']:g}, {row['weight_ratio']['global']:.6f}× with the global count; "
            + ("per-rank normalisation and local clipping are the bug" if reproduced else "no per-rank bias at this imbalance")
            + ("; the global count and norm match one process." if fixed else "."))


def rank_normalisation_note(head: dict) -> str:
    """The caption printed under the figure: what each panel measures (``head``: the ``headline_row``)."""
    return ("Left: the loss weight of one token × N (N: tokens of the whole batch) on the rank with fewer and the rank with "
            "more tokens, against the imbalance, when each rank divides by its own token count (bug) or by the all-reduced "
            f"count (fix); one process gives every token 1. Right: at imbalance {head['imbalance']:g}, in "
            f"{head['processes']} real processes (gloo), each rank's gradient-clipping coefficient when it clips by its shard's "
            f"norm (bug) or the all-reduced norm (fix); dotted: one process's coefficient, {head['clip_coef_single']:.3f}.")


# ---- explorer ------------------------------------------------------------------------------------
def imbalance_explorer(imbalance: float = 2.0) -> Explorer:
    """A slider for the imbalance: token weights per rank (real processes each redraw), bug vs fix."""

    def draw(imbalance):
        row = measure([imbalance])[0]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        labels = ["short rank (bug)", "long rank (bug)", "short rank (fix)", "long rank (fix)"]
        values = [row["weight_short_rank"]["local"], row["weight_long_rank"]["local"], row["weight_short_rank"]["global"],
                  row["weight_long_rank"]["global"]]
        ax.bar(labels, values, color=[plots.BUG_COLOR, plots.BUG_COLOR, plots.FIX_COLOR, plots.FIX_COLOR])
        ax.axhline(1.0, color=plots.NEUTRAL_COLOR, ls=":")
        ax.set_ylabel("token weight × N")
        ax.tick_params(axis="x", labelsize=8)
        return row

    slider = widgets.FloatSlider(value=imbalance, min=1.0, max=8.0, step=0.5, description="imbalance")
    return Explorer({"imbalance": slider}, draw, title="P33: token weights with a per-rank vs a global token count")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], row: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 33 (``row``: the ``headline_row``)."""
    reproduced, fixed = verdict(row)
    return dict(
        notebook="33_rank_local_normalisation", reproduced=reproduced,
        fixed=fixed and all(verdict(r)[1] for r in rows),
        metrics={"by_imbalance": {str(r["imbalance"]): r for r in rows}},
        headline={"what": f"weight of a short-rank / a long-rank token (imbalance {row['imbalance']:g}, {row['processes']} processes)",
                  "unit": "ratio", "bug": row["weight_ratio"]["local"], "fix": row["weight_ratio"]["global"]},
    )
