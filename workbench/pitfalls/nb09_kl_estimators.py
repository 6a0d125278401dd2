"""Pitfall P9: which KL estimator, and where it goes (reward or loss).

On a tiny model the exact per-token KL(π‖π_ref) = Σ_v π(v)·(log π(v) − log π_ref(v)) is a sum over
64 tokens, so every estimator can be judged exactly at each context, with no sampling noise:

* value: the estimator's mean over v ~ π (bias = mean − exact KL) and its standard deviation;
* gradient: what it contributes when differentiated *as a loss term* at sampled tokens,
  E_v[∇ k(r_v)] = Σ_v π(v) k'(r_v) ∇log π(v), versus the exact ∇KL — and versus k1 used as a
  *reward* with the score function, E_v[k1(r_v) ∇log π(v)].

With r = log π − log π_ref: k1 in the loss has k' = 1 → Σ π ∇log π = 0 (no gradient at all);
k2 has k' = r → exactly ∇KL; k3 has k' = 1 − π_ref/π → −Σ π_ref ∇log π, the gradient of the
*forward* KL(π_ref‖π). k1 as a reward gives Σ π r ∇log π = ∇KL. (Tang & Munos 2025.)
"""

from __future__ import annotations

import ipywidgets as widgets
import torch
import torch.nn.functional as F

from workbench.core.losses import kl_penalty
from workbench.modeling.perturbation import perturbed_copy
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import forward
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer

ESTIMATORS = ("k1", "k2", "k3")
GRADIENT_VARIANTS = ("k1 in reward", "k1 in loss", "k2 in loss", "k3 in loss")


# ---- measurements -------------------------------------------------------------------------------
def _distributions(policy, reference, input_ids, attention_mask, positions: torch.Tensor):
    """log π and log π_ref (N, V) at the selected (row, column) contexts."""
    logp = F.log_softmax(forward(policy, input_ids, attention_mask).float(), -1)[positions[:, 0], positions[:, 1]]
    with torch.no_grad():
        ref = F.log_softmax(forward(reference, input_ids, attention_mask).float(), -1)[positions[:, 0], positions[:, 1]]
    return logp, ref


def value_stats(policy, reference, input_ids, attention_mask, positions) -> dict:
    """Exact KL and, per estimator, its exact mean, bias and standard deviation over v ~ π (averaged over contexts)."""
    with torch.no_grad():
        logp, ref = _distributions(policy, reference, input_ids, attention_mask, positions)
        probs = logp.exp()
        log_ratio = logp - ref
        exact = (probs * log_ratio).sum(-1)
        out = {"exact_kl": float(exact.mean())}
        for kind in ESTIMATORS:
            values = kl_penalty(logp, ref, kind)
            mean = (probs * values).sum(-1)
            std = ((probs * (values - mean[:, None]) ** 2).sum(-1)).sqrt()
            out[kind] = {"mean": float(mean.mean()), "bias": float((mean - exact).mean()), "std": float(std.mean())}
    return out


def _flat_grad(model, scalar) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(scalar, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params, strict=True)])


def gradient_comparison(policy, reference, input_ids, attention_mask, positions) -> dict:
    """Cosine similarity and norm ratio of each variant's expected gradient with the exact ∇KL."""
    logp, ref = _distributions(policy, reference, input_ids, attention_mask, positions)
    probs = logp.exp().detach()
    log_ratio = (logp - ref).detach()
    exact = _flat_grad(policy, (logp.exp() * (logp - ref)).sum(-1).mean())
    # surrogates whose gradient equals the expected gradient Σ_v π(v)·c(v)·∇log π(v)
    coefficients = {
        "k1 in reward": log_ratio,  # score function with reward k1
        "k1 in loss": torch.ones_like(log_ratio),  # d k1 / d log π = 1
        "k2 in loss": log_ratio,  # d k2 / d log π = r
        "k3 in loss": 1 - torch.exp(-log_ratio),  # d k3 / d log π = 1 − π_ref/π
    }
    out = {}
    for name, coefficient in coefficients.items():
        grad = _flat_grad(policy, (probs * coefficient * logp).sum(-1).mean())
        out[name] = {
            "cosine": float(F.cosine_similarity(grad.double(), exact.double(), dim=0)) if grad.norm() > 0 else 0.0,
            "norm_ratio": float(grad.norm() / exact.norm()),
        }
    return out


@torch.no_grad()
def sampled_contexts(policy, tokenizer, prompts: list[str], *, max_new_tokens: int = 6, seed: int = 0):
    """Responses sampled from ``policy``: ``(ids, mask, positions)`` with ``positions`` the (row, column)
    of the context predicting each response token."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    rollout = sample(policy, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    ids, mask = rollout.sequences()
    positions = torch.nonzero(rollout.response_mask.bool())
    positions[:, 1] += prompt_ids.shape[1] - 1
    return ids, mask, positions


# ---- sweeps -------------------------------------------------------------------------------------
def sweep(reference, tokenizer, prompts: list[str], noise_scales, *, seed: int = 0) -> tuple[dict, dict]:
    """For each noise scale, a perturbed copy of ``reference`` as the policy: ``(values, gradients)``
    keyed by scale (``value_stats`` and ``gradient_comparison`` at the policy's sampled contexts)."""
    values, gradients = {}, {}
    for scale in noise_scales:
        policy = perturbed_copy(reference, scale, seed)
        ids, mask, positions = sampled_contexts(policy, tokenizer, prompts, seed=seed)
        values[scale] = value_stats(policy, reference, ids, mask, positions)
        gradients[scale] = gradient_comparison(policy, reference, ids, mask, positions)
    return values, gradients


# ---- verdict ------------------------------------------------------------------------------------
def verdict(values: dict, gradients: dict, *, no_gradient: float = 1e-3, agreement: float = 0.999) -> tuple[bool, bool]:
    """(reproduced, fixed): k1 differentiated as a loss gives (almost) no gradient — norm ratio to
    ∇KL below ``no_gradient`` at every distance — while k2 is visibly biased at the largest one;
    k1 as a reward and k2 as a loss both follow ∇KL (cosine > ``agreement`` and norm ratio within
    1 − ``agreement``) at every distance."""
    scales = list(gradients)
    reproduced = all(gradients[s]["k1 in loss"]["norm_ratio"] < no_gradient for s in scales) and \
        abs(values[scales[-1]]["k2"]["bias"]) > 1e-3
    fixed = all(gradients[s][v]["cosine"] > agreement and abs(gradients[s][v]["norm_ratio"] - 1) < 1 - agreement
                for s in scales for v in ("k1 in reward", "k2 in loss"))
    return bool(reproduced), bool(fixed)


# ---- figures ------------------------------------------------------------------------------------
STYLES = {"k1": ("o", "-", 10), "k2": ("s", "--", 5), "k3": ("^", ":", 6),
          "k1 in reward": ("o", "-", 9), "k1 in loss": ("x", "-", 6), "k2 in loss": ("s", "--", 5), "k3 in loss": ("^", ":", 6)}


def _line(ax, x, y, name, color, zorder):
    marker, ls, size = STYLES[name]
    ax.plot(x, y, ls=ls, marker=marker, markersize=size, color=color, label=name, zorder=zorder,
            markerfacecolor="none" if size >= 8 else color)


def plot_values(axes, values: dict) -> None:
    """Estimator mean (against the exact KL) and standard deviation over v ~ π, vs the exact KL.
    k1 and k3 are unbiased, so their means lie on the exact KL: hollow large markers keep them visible."""
    scales = list(values)
    exact = [values[s]["exact_kl"] for s in scales]
    axes[0].plot(exact, exact, color="black", lw=4, alpha=0.25, label="exact KL", zorder=1)
    for i, kind in enumerate(ESTIMATORS):
        _line(axes[0], exact, [values[s][kind]["mean"] for s in scales], kind, plots.SERIES_COLORS[i], 5 + i)
        _line(axes[1], exact, [values[s][kind]["std"] for s in scales], kind, plots.SERIES_COLORS[i], 5 + i)
    axes[0].set_ylabel("mean over v ~ π (nats)")
    axes[1].set_ylabel("std over v ~ π (nats)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("exact KL(π‖π_ref) per token (nats)")
    plots.legend_outside(axes[0], "right")


def figure_values(values: dict):
    """``plot_values`` on two panels side by side (caption: ``values_note``)."""
    return plots.figure_row(lambda axes: plot_values(axes, values), 2, (plots.NOTEBOOK_WIDTH, 3.4))


def plot_gradients(axes, values: dict, gradients: dict, *, undefined_below: float = 1e-4) -> None:
    """Cosine with the exact ∇KL and norm ratio per variant. Where a variant's gradient is (numerically)
    zero — norm ratio below ``undefined_below`` — its cosine is undefined and is not drawn."""
    scales = list(gradients)
    exact = [values[s]["exact_kl"] for s in scales]
    for i, name in enumerate(GRADIENT_VARIANTS):
        cosines = [gradients[s][name]["cosine"] if gradients[s][name]["norm_ratio"] >= undefined_below else float("nan")
                   for s in scales]
        _line(axes[0], exact, cosines, name, plots.SERIES_COLORS[i], 5 + i)
        _line(axes[1], exact, [gradients[s][name]["norm_ratio"] for s in scales], name, plots.SERIES_COLORS[i], 5 + i)
    if all(gradients[s]["k1 in loss"]["norm_ratio"] < undefined_below for s in scales):
        axes[0].text(0.02, 0.05, "k1 in loss: no gradient,\ncosine undefined", transform=axes[0].transAxes, fontsize=8)
    axes[0].set_ylabel("cosine with exact ∇KL")
    axes[1].set_ylabel("‖∇‖ / ‖∇KL‖")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("exact KL per token (nats)")
    plots.legend_outside(axes[0], "right")


def figure_gradients(values: dict, gradients: dict):
    """``plot_gradients`` on two panels side by side (caption: ``gradients_note``)."""
    return plots.figure_row(lambda axes: plot_gradients(axes, values, gradients), 2, (plots.NOTEBOOK_WIDTH, 3.4))


# ---- printers -----------------------------------------------------------------------------------
def values_line(values: dict, largest: float) -> str:
    """Bias and spread of each estimator at the noise scale ``largest``."""
    return f"exact KL {values[largest]['exact_kl']:.4f} nats/token: " + ", ".join(
        f"{k} bias {values[largest][k]['bias']:+.1e} std {values[largest][k]['std']:.3f}" for k in ESTIMATORS)


def values_lines(values: dict) -> str:
    """``values_line`` at the policy nearest the reference and at the farthest (by exact KL): where the estimators'
    spreads compare one way and where they may compare the other."""
    nearest, farthest = min(values, key=lambda s: values[s]["exact_kl"]), max(values, key=lambda s: values[s]["exact_kl"])
    return "\n".join(f"{where}: {values_line(values, scale)}" for where, scale in (("nearest", nearest), ("farthest", farthest)))


def values_note(values: dict) -> str:
    """The caption printed under part 1's figure."""
    return (f"Each estimator's exact mean (left) and standard deviation (right) over tokens v ~ π, averaged over the sampled "
            f"contexts, for {len(values)} policies at growing distance from the reference (x: their exact KL). k1 and k3 lie "
            "on the exact KL (grey), hence their large hollow markers; both axes logarithmic.")


def gradients_note(gradients: dict, undefined_below: float = 1e-4) -> str:
    """The caption printed under part 2's figure."""
    missing = all(gradients[s]["k1 in loss"]["norm_ratio"] < undefined_below for s in gradients)
    return ("Each variant's expected gradient against the exact ∇KL(π‖π_ref): cosine (left) and norm ratio (right, log axis)."
            + (f" k1 in the loss has no gradient (norm ratio < {undefined_below:g} at every distance), so its cosine is "
               "undefined and not drawn." if missing else ""))


def gradient_lines(gradients: dict, largest: float, *, undefined_below: float = 1e-4) -> str:
    """Cosine and norm ratio of each gradient variant at the noise scale ``largest``; a variant with no gradient (norm
    ratio below ``undefined_below``, as in ``plot_gradients``) has no direction, so its cosine is said to be undefined."""
    at = gradients[largest]

    def cosine(name):
        if at[name]["norm_ratio"] < undefined_below:
            return "cosine undefined (no gradient)"
        return f"cosine {at[name]['cosine']:+.4f}"

    return "\n".join(f"{name:>13}: {cosine(name)}, norm ratio {at[name]['norm_ratio']:.2e}" for name in GRADIENT_VARIANTS)


# ---- explorer -----------------------------------------------------------------------------------
def kl_estimator_gradient_explorer(noise_scales: list[float], values: dict, gradients: dict) -> Explorer:
    """P9: cosine of each estimator's expected gradient with ∇KL, at a chosen policy distance."""

    def draw(scale_index):
        scale = noise_scales[scale_index]
        fig, axes = plots.panel_grid(2, panel_height=3.0)
        plot_gradients(axes, {scale: values[scale]}, {scale: gradients[scale]})
        axes[0].set_title(f"noise {scale}: exact KL {values[scale]['exact_kl']:.3f} nats/token")
        fig.tight_layout()
        return gradients[scale]

    return Explorer({"scale_index": widgets.IntSlider(value=len(noise_scales) - 1, min=0, max=len(noise_scales) - 1,
                                                      description="distance")}, draw, "Gradient of each KL choice")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(*, values: dict, gradients: dict, noise_scales) -> dict:
    """Notebook 09's ``notebook_api.write_metrics`` keyword arguments (headline at the last noise scale)."""
    reproduced, fixed = verdict(values, gradients)
    largest = noise_scales[-1]
    return {
        "notebook": "09_kl_estimators", "reproduced": reproduced, "fixed": fixed,
        "metrics": {"exact_kl": {str(s): values[s]["exact_kl"] for s in noise_scales},
                    "bias": {k: {str(s): values[s][k]["bias"] for s in noise_scales} for k in ESTIMATORS},
                    "std": {k: {str(s): values[s][k]["std"] for s in noise_scales} for k in ESTIMATORS},
                    "gradient_cosine": {n: {str(s): gradients[s][n]["cosine"] for s in noise_scales} for n in GRADIENT_VARIANTS},
                    "gradient_norm_ratio": {n: {str(s): gradients[s][n]["norm_ratio"] for s in noise_scales} for n in GRADIENT_VARIANTS},
                    "k1_in_loss_gradient_norm_ratio": max(gradients[s]["k1 in loss"]["norm_ratio"] for s in noise_scales)},
        "headline": {"what": f"‖expected gradient‖ / ‖∇KL‖ at exact KL {values[largest]['exact_kl']:.3g}: "
                             "k1 in the loss vs k1 in the reward",
                     "unit": "ratio", "bug": gradients[largest]["k1 in loss"]["norm_ratio"],
                     "fix": gradients[largest]["k1 in reward"]["norm_ratio"]},
    }
