"""Pitfall P20: the gradient of a KL *estimate* is not the gradient of the KL.

For one next-token distribution π = softmax(θ) over V tokens and a reference π_ref, the reverse KL
and its exact gradient with respect to the logits are

    KL = Σ_v π(v) r(v),   r = log π − log π_ref,   ∂KL/∂θ_j = π_j (r_j − KL).

A trainer estimates KL from sampled tokens v ~ μ (μ = π_θold, which is π itself on-policy) and then
either differentiates the estimate as a loss term, or uses k1 = r(v) as a reward with the score
function. In expectation over v ~ μ the gradient each choice gives is

* k1 in the loss: Σ μ ∇log π = 0 on-policy — no gradient at all;
* k2 = r²/2 in the loss: Σ μ r ∇log π = ∇KL on-policy, biased once μ ≠ π;
* k3 = π_ref/π − 1 + r in the loss (GRPO's default): Σ μ (1 − π_ref/π) ∇log π = −Σ π_ref ∇log π on-policy,
  the gradient of the *forward* KL(π_ref ‖ π), not of the KL the config asks for;
* k1 in the reward (REINFORCE): Σ μ r ∇log π = ∇KL on-policy (Tang & Munos, arXiv 2506.09477);
* off-policy, the importance weight w = π/μ restores it: sg(w·r)·∇log π (OpenRLHF PR #1309), or w·k3 with
  w differentiable (DeepSeek-V3.2, TRL ``use_bias_correction_kl``): Σ ∇(π k3) = ∇KL.

Everything here is exact (sums over the vocabulary) except ``monte_carlo_error``, which draws samples
to show the bias floor of the biased choices against the 1/√N decay of the unbiased ones.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.ticker import NullFormatter

from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars, note_coinciding

VARIANTS = ("k1 in loss", "k2 in loss", "k3 in loss", "k1 in reward", "w·k1 in reward", "w·k3 in loss")


# ---- measurements -------------------------------------------------------------------------------
def exact_kl(theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    logp, ref = F.log_softmax(theta, -1), F.log_softmax(ref_logits, -1)
    return (logp.exp() * (logp - ref)).sum(-1)


def exact_kl_gradient(theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """∂KL(softmax θ ‖ softmax ref)/∂θ = π ⊙ (r − KL), closed form, for logits of shape (..., V)."""
    logp, ref = F.log_softmax(theta.double(), -1), F.log_softmax(ref_logits.double(), -1)
    probs, r = logp.exp(), logp - ref
    return probs * (r - (probs * r).sum(-1, keepdim=True))


def per_sample_surrogate(variant: str, logp: torch.Tensor, ref: torch.Tensor, logmu: torch.Tensor) -> torch.Tensor:
    """The per-token term whose gradient a trainer backpropagates, at every token v (..., V).

    ``logp`` = log π_θ (differentiable), ``ref`` = log π_ref, ``logmu`` = log of the sampling distribution
    (both constants)."""
    r = logp - ref
    w = torch.exp(logp - logmu)  # importance weight π/μ (1 in value on-policy, but differentiable)
    if variant == "k1 in loss":
        return r
    if variant == "k2 in loss":
        return 0.5 * r**2
    if variant == "k3 in loss":
        return torch.exp(-r) - 1 + r
    if variant == "k1 in reward":
        return r.detach() * logp
    if variant == "w·k1 in reward":
        return (w * r).detach() * logp
    if variant == "w·k3 in loss":
        return w * (torch.exp(-r) - 1 + r)
    raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")


def expected_gradient(theta: torch.Tensor, ref_logits: torch.Tensor, variant: str,
                      sampling_logits: torch.Tensor | None = None, sample_weights: torch.Tensor | None = None) -> torch.Tensor:
    """E_{v~μ}[∇_θ f(v)] exactly: ∇ Σ_v μ(v) f(v) with μ = softmax(``sampling_logits``) held constant
    (μ = π on-policy). ``sample_weights`` replaces μ in the average (not in the importance weight):
    the empirical frequencies of N sampled tokens give the N-sample estimate."""
    theta = theta.detach().double().requires_grad_(True)
    logp = F.log_softmax(theta, -1)
    ref = F.log_softmax(ref_logits.double(), -1)
    logmu = (logp if sampling_logits is None else F.log_softmax(sampling_logits.double(), -1)).detach()
    weights = logmu.exp() if sample_weights is None else sample_weights.double()
    surrogate = (weights * per_sample_surrogate(variant, logp, ref, logmu)).sum()
    return torch.autograd.grad(surrogate, theta)[0]


def relative_error(gradient: torch.Tensor, exact: torch.Tensor) -> float:
    return float((gradient - exact).norm() / exact.norm())


def expected_gradients(theta: torch.Tensor, ref_logits: torch.Tensor, sampling_logits: torch.Tensor | None = None) -> dict:
    """``{"exact": ∇KL, variant: expected_gradient(...) for each of VARIANTS}``, each shaped like ``theta``."""
    return {"exact": exact_kl_gradient(theta, ref_logits)} | {
        variant: expected_gradient(theta, ref_logits, variant, sampling_logits) for variant in VARIANTS}


def gradient_errors(gradients: dict) -> dict:
    """``{variant: {"relative_error", "cosine", "norm_ratio"}}`` of each expected gradient of ``expected_gradients``
    against ∇KL, over all rows (contexts) at once."""
    exact = gradients["exact"].flatten()
    out = {}
    for variant in VARIANTS:
        g = gradients[variant].flatten()
        out[variant] = {"relative_error": relative_error(g, exact), "norm_ratio": float(g.norm() / exact.norm()),
                        "cosine": float(F.cosine_similarity(g, exact, dim=0)) if g.norm() > 0 else 0.0}
    return out


def compare(theta: torch.Tensor, ref_logits: torch.Tensor, sampling_logits: torch.Tensor | None = None) -> dict:
    """``gradient_errors`` of the ``expected_gradients`` of ``theta`` (rows: contexts)."""
    return gradient_errors(expected_gradients(theta, ref_logits, sampling_logits))


def small_softmax(vocab: int = 6, scale: float = 1.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random policy and reference logits (standard normal × ``scale``) over a ``vocab``-token vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(vocab, generator=generator, dtype=torch.float64),
            scale * torch.randn(vocab, generator=generator, dtype=torch.float64))


@torch.no_grad()
def next_token_logits(model, tokenizer, prompts: list[str]) -> torch.Tensor:
    """(N, V) logits of the next token after each prompt (left-padded, position ids from the mask)."""
    from workbench.modeling.scoring import forward
    from workbench.tasks import encode_prompts

    ids, mask = encode_prompts(tokenizer, prompts)
    return forward(model, ids, mask)[:, -1].double().cpu()  # the sweeps below run on the CPU in float64


def monte_carlo_error(theta: torch.Tensor, ref_logits: torch.Tensor, variant: str, sample_sizes: list[int], *,
                      trials: int = 20, seed: int = 0) -> list[float]:
    """Mean relative error of the N-sample gradient estimate (on-policy, one context) against ∇KL."""
    generator = torch.Generator().manual_seed(seed)
    exact = exact_kl_gradient(theta, ref_logits)
    probs = F.softmax(theta.double(), -1)
    errors = []
    for n in sample_sizes:
        total = 0.0
        for _ in range(trials):
            counts = torch.bincount(torch.multinomial(probs, n, replacement=True, generator=generator), minlength=theta.shape[-1])
            g = expected_gradient(theta, ref_logits, variant, sample_weights=counts.double() / n)  # mean of f over the N draws
            total += relative_error(g, exact)
        errors.append(total / trials)
    return errors


# ---- sweeps -------------------------------------------------------------------------------------
def off_policy_sweep(theta_old: torch.Tensor, ref_logits: torch.Tensor, steps: list[float], seed: int = 0) -> list[dict]:
    """Samples from π_old = softmax(θ_old); the current policy θ = θ_old + s·δ (δ fixed, standard normal) for
    every s in ``steps``. ``compare`` at each s."""
    delta = torch.randn(theta_old.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return [{"step": s, **compare(theta_old.double() + s * delta, ref_logits, sampling_logits=theta_old)} for s in steps]


MONTE_CARLO_VARIANTS = ("k1 in loss", "k3 in loss", "k1 in reward")  # the N-sample estimates drawn in the notebook


def monte_carlo_sweep(theta: torch.Tensor, ref_logits: torch.Tensor, sample_sizes: list[int], *, trials: int = 20,
                      seed: int = 0) -> dict:
    """``{variant: monte_carlo_error(...)}`` for each of ``MONTE_CARLO_VARIANTS``."""
    return {v: monte_carlo_error(theta, ref_logits, v, sample_sizes, trials=trials, seed=seed) for v in MONTE_CARLO_VARIANTS}


# ---- verdict ------------------------------------------------------------------------------------
UNBIASED_ON_POLICY = ("k2 in loss", "k1 in reward", "w·k1 in reward", "w·k3 in loss")
UNBIASED_OFF_POLICY = ("w·k1 in reward", "w·k3 in loss")


def verdict(on_policy: dict, off_policy: dict, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``compare`` on-policy and at one off-policy step.

    Reproduced: k1 in the loss gives no gradient (norm ratio < ``tolerance``) and k3 in the loss is off
    by more than 5 %; fixed: every unbiased choice matches ∇KL to ``tolerance`` where it should.
    """
    reproduced = on_policy["k1 in loss"]["norm_ratio"] < tolerance and on_policy["k3 in loss"]["relative_error"] > 0.05
    fixed = (all(on_policy[v]["relative_error"] < tolerance for v in UNBIASED_ON_POLICY)
             and all(off_policy[v]["relative_error"] < tolerance for v in UNBIASED_OFF_POLICY))
    return reproduced, fixed


# ---- figures ------------------------------------------------------------------------------------
FLOOR = 1e-16  # where a log axis draws a relative error below float64 round-off (an exact 0 included)
BUGS = ("k1 in loss", "k3 in loss")  # k1 in the loss: no gradient at all; k3 in the loss: the forward KL's gradient
FIX = "w·k1 in reward"  # unbiased on- and off-policy
# variant: (series colour index or "BUG_COLOR"/"FIX_COLOR", bar hatch, line style). Both bugs are vermilion, told apart
# by hatch and line style; the fix is blue; the unbiased alternatives take series colours.
VARIANT_STYLES = {"k1 in loss": ("BUG_COLOR", "///", "s:"), "k2 in loss": (4, "", "o--"), "k3 in loss": ("BUG_COLOR", "", "o-"),
                  "k1 in reward": (2, "", "o-"), "w·k1 in reward": ("FIX_COLOR", "", "o-"), "w·k3 in loss": (5, "", "o--")}


def variant_label(variant: str) -> str:
    """The legend's name of ``variant``: tagged "(bug)" or "(fix)" where it is one."""
    return variant + (" (bug)" if variant in BUGS else " (fix)" if variant == FIX else "")


def variant_color(variant: str) -> str:
    from workbench.viz import plots

    color = VARIANT_STYLES[variant][0]
    return getattr(plots, color) if isinstance(color, str) else plots.SERIES_COLORS[color]


def plot_per_logit(ax, gradients: dict, variants: tuple = ("k1 in loss", "k3 in loss", "k1 in reward"), *,
                   legend: bool = True) -> None:
    """∂/∂θ_j of the exact KL and of each variant's expected gradient (``expected_gradients`` of one context), token by
    token."""
    from workbench.viz import plots

    exact = gradients["exact"]
    width = 0.8 / (len(variants) + 1)
    x = torch.arange(exact.shape[-1]).double()
    ax.bar((x - 0.4 + width / 2).tolist(), exact.tolist(), width, color="black", label="exact ∇KL")
    for i, v in enumerate(variants, start=1):
        bars = ax.bar((x - 0.4 + width / 2 + i * width).tolist(), gradients[v].tolist(), width,
                      color=variant_color(v), hatch=VARIANT_STYLES[v][1], edgecolor="white", lw=0, label=variant_label(v))
        label_zero_bars(ax, bars, tol=1e-12 * float(exact.abs().max()))  # 0 to float precision: written, a bar cannot show it
    ax.axhline(0, color=plots.NEUTRAL_COLOR, lw=0.8)
    ax.set_xlabel("token j (small softmax)")
    ax.set_ylabel("∂ / ∂θ_j")
    if legend:
        plots.legend_outside(ax, ncol=2)


def plot_bars(ax, on_policy: dict, title: str) -> None:
    """Each variant's relative error on a log axis, its value written on the bar; below ``FLOOR`` drawn at it (the
    caption, ``caption_note``, names those)."""
    errors = [on_policy[v]["relative_error"] for v in VARIANTS]
    bars = ax.bar(range(len(VARIANTS)), [max(e, FLOOR) for e in errors], color=[variant_color(v) for v in VARIANTS],
                  hatch=None, edgecolor="white", lw=0)
    for bar, v, e in zip(bars, VARIANTS, errors, strict=True):
        bar.set_hatch(VARIANT_STYLES[v][1])
        ax.annotate(f"{e:.0e}", (bar.get_x() + bar.get_width() / 2, max(e, FLOOR)), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(VARIANTS)), [variant_label(v) for v in VARIANTS], rotation=90,
                  fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the values written over the bars
    ax.set_ylabel("relative error of E[∇]")
    ax.set_title(title, fontsize=10)


def plot_off_policy(ax, rows: list[dict]) -> None:
    """Each variant's relative error against the step from the sampling policy (all of ``VARIANTS``; below ``FLOOR``
    drawn at it, said)."""
    from workbench.viz import plots

    steps = [r["step"] for r in rows]
    for v in VARIANTS:
        ax.plot(steps, [max(r[v]["relative_error"], FLOOR) for r in rows], VARIANT_STYLES[v][2], color=variant_color(v),
                label=variant_label(v), ms=4)
    ax.set_yscale("log")
    if any(r[v]["relative_error"] < FLOOR for r in rows for v in VARIANTS):
        plots.draw_floor(ax, FLOOR, f"< {FLOOR:g} (round-off)")
    ax.set_xlabel("step s from π_old")
    ax.set_ylabel("relative error of E[∇]")
    note_coinciding(ax, ring_only=True)  # rings the hidden points; the labels stay short (the caption says what a ring is)
    if ax.get_legend():
        ax.get_legend().remove()


def plot_monte_carlo(ax, sample_sizes: list[int], errors: dict) -> None:
    for v, values in errors.items():
        ax.plot(sample_sizes, values, VARIANT_STYLES[v][2], color=variant_color(v), label=variant_label(v), ms=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(sample_sizes, [str(n) for n in sample_sizes])  # the sizes run: minor labels would crowd a short span
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sampled tokens N")
    ax.set_ylabel("mean relative error")


def figure_kl_gradients(small_gradients: dict, tiny: tuple, on_policy: dict, off_policy: list[dict], sample_sizes: list[int],
                        mc: dict):
    """The notebook's four panels, 2 × 2 with one legend under them: the small softmax per logit (its
    ``expected_gradients``), the tiny model on-policy, off-policy, N samples. ``tiny`` is the tiny model's (policy logits,
    reference logits) pair."""
    from workbench.viz import plots

    theta, ref_logits = tiny
    fig, axes = plots.panel_grid(4, panel_height=3.5)
    plot_per_logit(axes[0], small_gradients, legend=False)
    kl = float(exact_kl(theta, ref_logits).mean())
    plot_bars(axes[1], on_policy, f"tiny model, on-policy ({theta.shape[0]} contexts, KL {kl:.3f} nats)")
    plot_off_policy(axes[2], off_policy)
    plot_monte_carlo(axes[3], sample_sizes, mc)
    handles = {label: handle for ax in (axes[0], axes[2]) for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=4, fontsize=9)
    fig.tight_layout(rect=(0, 0.09, 1, 1))  # the bottom strip holds the legend
    return fig


# ---- printers -----------------------------------------------------------------------------------
def caption_note(on_policy: dict, contexts: int, vocab: int) -> str:
    """The caption under the figure: each panel's setting, and the on-policy errors drawn at ``FLOOR``."""
    clamped = [variant_label(v) for v in VARIANTS if on_policy[v]["relative_error"] < FLOOR]
    return (f"(a) The expected gradient of each KL term on the {vocab} logits of a small softmax policy, against the exact "
            f"∇KL (black); a written 0 is a bar of height 0. (b) ‖E[∇ estimate] − ∇KL‖ / ‖∇KL‖ on the tiny model's next-token "
            f"distributions ({contexts} contexts), on-policy; the value is written over each bar"
            + (f", and the bars of {', '.join(clamped)} (under {FLOOR:g}, round-off) are drawn at {FLOOR:g}" if clamped else "")
            + ". (c) The same error after the policy moved a step s from the sampling policy, θ = θ_old + s·δ. (d) The mean "
            "error of N-sample estimates on (a)'s softmax. A ring marks a point hidden under another series.")


def gradient_lines(small: dict, on_policy: dict, off_policy: list[dict], sample_sizes: list[int], mc: dict) -> str:
    """Each estimator's relative error (small softmax, tiny model, farthest off-policy step), the Monte Carlo errors
    and the verdict in words."""
    last = off_policy[-1]
    lines = [f"{v:>15}: relative error small softmax {small[v]['relative_error']:.2e}, tiny model {on_policy[v]['relative_error']:.2e}, "
             f"off-policy s={last['step']} {last[v]['relative_error']:.2e}, cosine {on_policy[v]['cosine']:+.3f}" for v in VARIANTS]
    lines.append("Monte Carlo at N = " + ", ".join(f"{n}" for n in sample_sizes) + ": "
                 + "; ".join(f"{v} " + ", ".join(f"{e:.3f}" for e in errs) for v, errs in mc.items()))
    lines.append(("k1 in the loss gives no gradient and k3 in the loss follows the forward KL" if verdict(on_policy, off_policy[0])[0]
                  else "no estimator bias measured")
                 + f" (k3 off by {on_policy['k3 in loss']['relative_error']:.0%}); "
                 f"k1 as a reward is off by {on_policy['k1 in reward']['relative_error']:.1e}.")
    return "\n".join(lines)


# ---- explorer -----------------------------------------------------------------------------------
def off_policy_gradient_explorer(theta_old: torch.Tensor, ref_logits: torch.Tensor, *, seed: int = 0, step: float = 0.2) -> Explorer:
    """P20: each estimator's expected-gradient error once the policy moved a step s from the sampling policy."""

    def draw(s):
        row = off_policy_sweep(theta_old, ref_logits, [s], seed=seed)[0]
        fig, ax = plt.subplots(figsize=(8, 3.4))
        plot_bars(ax, row, f"θ = θ_old + {s:g}·δ: samples from π_old")
        return row

    slider = widgets.FloatSlider(value=step, min=0.0, max=2.0, step=0.05, description="step s")
    return Explorer({"s": slider}, draw, "P20: the KL gradient off-policy")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, on_policy: dict, small: dict, off_policy: list[dict], sample_sizes: list[int], mc: dict) -> dict:
    """Notebook 20's ``notebook_api.write_metrics`` keyword arguments: reproduced on the tiny model on-policy (the first
    off-policy step for the weighted choices), fixed there and at the farthest off-policy step on the small softmax."""
    reproduced, fixed = verdict(on_policy, off_policy[0])
    k3_error = on_policy["k3 in loss"]["relative_error"]
    return {
        "notebook": "20_kl_gradient", "reproduced": reproduced, "fixed": fixed and verdict(small, off_policy[-1])[1],
        "not_shown": None if reproduced else (f"on this policy/reference pair the k3-in-loss gradient is off by only {k3_error:.3g} "
                                              "of ∇KL (≤ 5 %): the two models are too close for the estimator's bias to show"),
        "metrics": {"on_policy_tiny_model": on_policy, "on_policy_small_softmax": small, "off_policy": off_policy,
                    "monte_carlo_relative_error": {v: dict(zip(map(str, sample_sizes), errs, strict=True)) for v, errs in mc.items()}},
        "headline": {"what": "relative error of the expected KL gradient on the tiny model: k3 in the loss vs k1 as a reward",
                     "unit": "‖g − ∇KL‖ / ‖∇KL‖", "bug": k3_error, "fix": on_policy["k1 in reward"]["relative_error"]},
    }
