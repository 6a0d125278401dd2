"""Pitfall P26: GSPO's sequence ratio broadcast over tokens, then summed — long samples weigh more.

GSPO (arXiv 2507.18071) replaces GRPO's per-token ratio with one ratio per sequence,
s_i = exp(mean_t log π/π_old), and its objective averages one clipped term per *sequence*:
J = 1/G Σ_i min(s_i A_i, clip(s_i) A_i). Every sample weighs 1/G, whatever its length; the
1/|y_i| inside s_i is what keeps a long sample from dominating.

**The bug.** TRL's ``importance_sampling_level="sequence"`` (#3823) computed that per-sequence term
with shape (B, 1), then fed it to the token aggregation of its ``loss_type`` (``dapo``, ``bnpo``,
``dr_grpo``): ``(per_token_loss * completion_mask).sum() / completion_mask.sum()``. Broadcasting
(B, 1) against the (B, T) mask copies the sequence's term onto each of its |y_i| tokens, so the
sample weighs |y_i| / Σ|y| instead of 1/G: the long/short gradient-weight ratio equals the length
ratio. TRL PR #6042 (June 2026) warns on that combination and points to ``loss_type="grpo"``, whose
per-sequence token mean divides the |y_i| copies back out. (The KL term under sequence-level
importance sampling has its own bias correction question: TRL #6586.)

**The fix.** Reduce the per-sequence term over sequences (``per_sequence_loss.mean()``), or keep a
per-token layout and use a per-sequence token mean.

Measured here on exact tensors: the gradient of the loss with respect to each token's log-prob, summed
over the sample's tokens and divided by |A_i|, is the sample's weight.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer

REDUCTIONS = ("broadcast token-mean", "per-sequence mean")  # the bug, the fix


# ---- measurements --------------------------------------------------------------------------------
def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = exp(Σ_t m·(log π − log π_old) / |y_i|), shape (B,)."""
    mask = mask.float()
    return torch.exp(((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp_min(1))


def gspo_loss(logp, old_logp, advantages, mask, *, reduction: str = "per-sequence mean", clip: float = 3e-4):
    """GSPO's clipped sequence-level surrogate, reduced the buggy way (``"broadcast token-mean"``:
    the (B, 1) term times the (B, T) mask, summed over tokens, divided by the token count — TRL's
    ``dapo``/``bnpo`` path under ``importance_sampling_level="sequence"``) or the paper's way
    (``"per-sequence mean"``)."""
    s = sequence_ratio(logp, old_logp, mask)
    per_sequence = -torch.minimum(s * advantages, s.clamp(1 - clip, 1 + clip) * advantages)  # (B,)
    if reduction == "broadcast token-mean":
        mask = mask.float()
        return (per_sequence[:, None] * mask).sum() / mask.sum()
    if reduction == "per-sequence mean":
        return per_sequence.mean()
    raise ValueError(f"reduction {reduction!r}: use one of {REDUCTIONS}")


def sample_weights(lengths: list[int], reduction: str, *, seed: int = 0, noise: float = 1e-5) -> torch.Tensor:
    """Each sample's gradient weight Σ_t |∂L/∂log π_t| / |A_i| (s ≈ 1, inside the clip range), one per length.

    Log-probs are random, the old ones a hair away (``noise``) so the ratio is not exactly 1 but not
    clipped; advantages alternate ±1. The weights sum to 1 under either reduction when s = 1.
    """
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()
    old = -torch.rand(len(lengths), width, generator=g) * 3
    logp = (old + noise * torch.randn(old.shape, generator=g)).requires_grad_(True)
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(lengths))])
    gspo_loss(logp, old, advantages, mask, reduction=reduction).backward()
    return (logp.grad.abs() * mask).sum(-1) / advantages.abs()


@torch.no_grad()
def sampled_lengths(model, tokenizer, prompts: list[str], seed: int = 0, max_new_tokens: int = 12) -> list[int]:
    """Response lengths (EOS included) of one completion per prompt sampled from ``model``."""
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    return [max(int(n), 1) for n in rollout.response_lengths.tolist()]


def batch_weights(lengths: list[int], seed: int = 0) -> dict:
    """Per-sample weights of a batch with these lengths, per reduction, and the share of the update
    the longest quarter of the samples gets."""
    out = {"lengths": list(lengths)}
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    top = order[-max(len(lengths) // 4, 1):]
    for reduction in REDUCTIONS:
        w = sample_weights(lengths, reduction, seed=seed)
        out[reduction] = w.tolist()
        out[f"{reduction} longest-quarter share"] = float(w[top].sum() / w.sum())
    out["longest-quarter token share"] = sum(lengths[i] for i in top) / sum(lengths)
    return out


# ---- sweeps --------------------------------------------------------------------------------------
def length_ratio_sweep(long_lengths: list[int], short_length: int, seed: int = 0) -> list[dict]:
    """A batch of one short and one long sample: the long/short weight ratio per reduction, for each long length."""
    rows = []
    for length in long_lengths:
        row = {"long": length, "short": short_length, "length_ratio": length / short_length}
        for reduction in REDUCTIONS:
            w = sample_weights([short_length, length], reduction, seed=seed)
            row[reduction] = float(w[1] / w[0])
        rows.append(row)
    return rows


def headline_row(rows: list[dict]) -> dict:
    """The ``length_ratio_sweep`` row with the longest long sample."""
    return max(rows, key=lambda r: r["long"])


# ---- verdict -------------------------------------------------------------------------------------
def verdict(rows: list[dict], *, tolerance: float = 0.02) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``length_ratio_sweep`` rows.

    Reproduced: the bug's long/short weight ratio is the length ratio (within ``tolerance``, relative)
    for every row where the lengths differ; fixed: the fix's ratio is 1 (within ``tolerance``) everywhere.
    """
    unequal = [r for r in rows if r["long"] != r["short"]]
    reproduced = bool(unequal) and all(abs(r["broadcast token-mean"] / r["length_ratio"] - 1) < tolerance for r in unequal)
    fixed = bool(rows) and all(abs(r["per-sequence mean"] - 1) < tolerance for r in rows)
    return reproduced, fixed


# ---- figures -------------------------------------------------------------------------------------
def plot_ratio(ax, rows: list[dict]) -> None:
    """Long/short gradient-weight ratio vs the long sample's length (log₂ axis): the bug's hollow circles sit on the
    dotted length ratio |y_long|/|y_short|, the fix stays at 1."""
    x = [r["long"] for r in rows]
    ax.plot(x, [r["broadcast token-mean"] for r in rows], "o", color=plots.BUG_COLOR, mfc="none", ms=8, mew=1.5,
            label="(B,1) × mask, token mean (bug)")
    ax.plot(x, [r["length_ratio"] for r in rows], ":", color=plots.NEUTRAL_COLOR, label="|y_long| / |y_short|")
    ax.plot(x, [r["per-sequence mean"] for r in rows], "s-", color=plots.FIX_COLOR, label="mean over sequences (fix)", ms=4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(v) for v in x])
    ax.minorticks_off()
    ax.set_xlabel(f"long sample's length (short: {rows[0]['short']})")
    ax.set_ylabel("weight, long / short")
    ax.set_title("two samples, one sequence ratio", fontsize=10)


def plot_batch(ax, batch: dict) -> None:
    """Each sampled response's gradient weight against its length, both reductions."""
    lengths = batch["lengths"]
    ax.scatter(lengths, batch["broadcast token-mean"], color=plots.BUG_COLOR, marker="o", s=14, label="bug")
    ax.scatter(lengths, batch["per-sequence mean"], color=plots.FIX_COLOR, marker="s", s=14, label="fix")
    plots.integer_axis(ax.xaxis)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("share of the gradient")
    ax.set_title(f"sampled batch ({len(lengths)} responses)", fontsize=10)


def figure_gspo(rows: list[dict], batch: dict):
    """The notebook's figure: ``plot_ratio`` and ``plot_batch`` side by side, one legend under them (``gspo_note`` is the
    caption)."""
    fig = plots.figure_panels((plots.NOTEBOOK_WIDTH, 3.2), lambda ax: plot_ratio(ax, rows), lambda ax: plot_batch(ax, batch))
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=9)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def ratio_lines(rows: list[dict], batch: dict) -> str:
    lines = [f"|y| {r['short']} vs {r['long']}: weight ratio bug {r['broadcast token-mean']:.3f} "
             f"(length ratio {r['length_ratio']:.3f}), fix {r['per-sequence mean']:.4f}" for r in rows]
    lines.append(f"sampled batch of {len(batch['lengths'])} (lengths {min(batch['lengths'])}–{max(batch['lengths'])}): "
                 f"the longest quarter gets {batch['broadcast token-mean longest-quarter share']:.1%} of the update with the bug "
                 f"(its token share {batch['longest-quarter token share']:.1%}), "
                 f"{batch['per-sequence mean longest-quarter share']:.1%} with the fix")
    return "\n".join(lines)


def gspo_note(rows: list[dict], batch: dict) -> str:
    """The caption printed under ``figure_gspo``: what each panel draws, in words the labels leave out."""
    return (f"Left: a batch of one sample of {rows[0]['short']} tokens and one longer one (advantages ±1, sequence ratios "
            "inside the clip range): the long sample's gradient weight over the short one's when the (B, 1) clipped term is "
            "multiplied by the mask and token-averaged (bug) or averaged over sequences (fix); dotted: the length ratio. Right: "
            f"each response of a batch sampled from the model ({len(batch['lengths'])} responses): its share of the gradient "
            "against its length, both reductions.")


def headline_sentence(rows: list[dict], head: dict) -> str:
    """The weight ratio of the ``headline_row`` ``head`` with the bug and with the fix, and the verdict's reading."""
    reproduced, fixed = verdict(rows)
    what = ("the bug weighs samples by their length" if reproduced else "no length weighting measured")
    return (f"{head['long']} vs {head['short']} tokens: long/short weight {head['broadcast token-mean']:.2f} with the bug, "
            f"{head['per-sequence mean']:.3f} with the fix — {what}; " + ("the fix weighs them equally." if fixed else "the fix does not."))


# ---- explorer ------------------------------------------------------------------------------------
def length_explorer(short_length: int = 4, long_length: int = 32) -> Explorer:
    """Sliders for the two lengths: the two samples' weights under each reduction, redrawn."""

    def draw(short, long):
        rows = length_ratio_sweep([long], short)
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.bar(["bug", "fix"], [rows[0]["broadcast token-mean"], rows[0]["per-sequence mean"]],
               color=[plots.BUG_COLOR, plots.FIX_COLOR])
        ax.axhline(rows[0]["length_ratio"], ls=":", color=plots.NEUTRAL_COLOR, label="length ratio")
        ax.set_ylabel("gradient weight, long / short")
        ax.legend(fontsize=8)
        return rows[0]

    controls = {"short": widgets.IntSlider(value=short_length, min=1, max=64, description="short"),
                "long": widgets.IntSlider(value=long_length, min=1, max=256, description="long")}
    return Explorer(controls, draw, title="P26: GSPO gradient weight of a long vs a short sample")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], batch: dict, head: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 26 (``head``: the ``headline_row``)."""
    reproduced, fixed = verdict(rows)
    return dict(
        notebook="26_gspo_length_weighting", reproduced=reproduced, fixed=fixed,
        metrics={"length_ratio_sweep": rows,
                 "sampled_batch": {k: v for k, v in batch.items() if k.endswith("share")} | {"lengths": batch["lengths"]}},
        headline={"what": f"gradient weight of a {head['long']}-token sample / a {head['short']}-token one (paper: 1)", "unit": "ratio",
                  "bug": head["broadcast token-mean"], "fix": head["per-sequence mean"]},
    )
