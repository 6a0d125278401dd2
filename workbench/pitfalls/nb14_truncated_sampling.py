"""Pitfall P14: sampling with top-p/top-k, scoring with the full softmax.

The sampler draws from the processed distribution p(v)/S over the kept set (S = kept probability
mass, ``workbench.core.sampling_filters``) and records log p(v) − log S. A trainer that recomputes
log-probs with the full softmax gets log p(v), so before any update

    log ρ = log p(v) − (log p(v) − log S) = log S   ⇒   ρ = S ≤ 1 at every token,

whatever token was drawn: the importance ratio is the kept mass, not 1, and every per-token loss is
scaled by S (TRL #6789: TRL took vLLM's processed log-probs but scored the full vocabulary; fix in
PR #7269). With top-p, S ≥ top_p by construction; with top-k, S can be far smaller. The fix scores
the same processed distribution: the same filters on the same (temperature-divided) logits.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.devices import model_device
from workbench.core.sampling_filters import kept_mass, processed_logprobs
from workbench.modeling.rollout import Rollout, sample
from workbench.modeling.scoring import forward, logprobs_from_logits
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars


# ---- measurements -------------------------------------------------------------------------------
def rollout_with_filters(model, tokenizer, prompts: list[str], *, top_k: int = 0, top_p: float = 1.0,
                         temperature: float = 1.0, seed: int = 0, max_new_tokens: int = 6) -> Rollout:
    ids, mask = (t.to(model_device(model)) for t in encode_prompts(tokenizer, prompts))  # everything on the model's device
    return sample(model, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def response_logits(model, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """(B, R, V) logits / τ at the positions that predict each response token."""
    ids, mask = rollout.sequences()
    width = rollout.prompt_ids.shape[1]
    return forward(model, ids, mask)[:, width - 1 : -1].float() / temperature  # upcast, then divide


def rescore(logits: torch.Tensor, response_ids: torch.Tensor, *, top_k: int, top_p: float, renormalise: bool) -> torch.Tensor:
    """Trainer-side log-probs: full softmax (``renormalise=False``, bug) or the sampler's processed
    distribution (``renormalise=True``, fix)."""
    if renormalise:
        return processed_logprobs(logits, response_ids, top_k=top_k, top_p=top_p)
    return logprobs_from_logits(logits, response_ids)


def first_step_ratio(model, tokenizer, prompts: list[str], *, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0,
                     seed: int = 0, max_new_tokens: int = 6, clip_eps: float = 0.2) -> dict:
    """Importance ratio at learning rate 0 for one top-k/top-p setting, bug and fix side by side.

    ``kept_mass``: mean S at the sampled positions; ``bug``/``fix``: mean ratio, max |ρ − 1|, the
    share of tokens outside the PPO clip range [1 − ε, 1 + ε]; ``max_ratio_minus_mass``: max |ρ_bug − S|
    (the closed form ρ = S, token by token).
    """
    rollout = rollout_with_filters(model, tokenizer, prompts, top_k=top_k, top_p=top_p, temperature=temperature,
                                   seed=seed, max_new_tokens=max_new_tokens)
    logits = response_logits(model, rollout, temperature)
    real = rollout.response_mask.bool()
    mass = kept_mass(logits, top_k=top_k, top_p=top_p)[real]
    out = {"top_k": top_k, "top_p": top_p, "tokens": int(real.sum()), "kept_mass": float(mass.mean())}
    for name, renormalise in (("bug", False), ("fix", True)):
        logp = rescore(logits, rollout.response_ids, top_k=top_k, top_p=top_p, renormalise=renormalise)
        ratio = (logp - rollout.rollout_logprobs)[real].exp()
        out[name] = {"mean_ratio": float(ratio.mean()), "max_ratio_deviation": float((ratio - 1).abs().max()),
                     "clip_fraction": float(((ratio - 1).abs() > clip_eps).float().mean())}
        if name == "bug":
            out["max_ratio_minus_mass"] = float((ratio - mass).abs().max())
    return out


# ---- sweeps -------------------------------------------------------------------------------------
def settings_for(top_ps: list[float], top_ks: list[int]) -> list[tuple[int, float]]:
    """The notebook's (top_k, top_p) settings: no filter, each top-p alone, each top-k alone."""
    return [(0, 1.0)] + [(0, p) for p in top_ps] + [(k, 1.0) for k in top_ks]


def sweep(model, tokenizer, prompts: list[str], settings: list[tuple[int, float]], **kwargs) -> list[dict]:
    """``first_step_ratio`` for every ``(top_k, top_p)`` in ``settings``."""
    return [first_step_ratio(model, tokenizer, prompts, top_k=k, top_p=p, **kwargs) for k, p in settings]


def headline_row(rows: list[dict]) -> dict:
    """The headline setting: top-p 0.8 alone when swept, else the last setting."""
    return next((r for r in rows if r["top_p"] == 0.8 and not r["top_k"]), rows[-1])


# ---- verdict ------------------------------------------------------------------------------------
def verdict(row: dict, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) for one truncating setting's ``first_step_ratio`` row.

    Reproduced: the full-softmax mean ratio sits measurably below 1 and equals the kept mass;
    fixed: every renormalised ratio is 1 to ``tolerance``.
    """
    bug, fix = row["bug"], row["fix"]
    reproduced = bug["mean_ratio"] < 1 - 10 * tolerance and abs(bug["mean_ratio"] - row["kept_mass"]) < tolerance
    return reproduced, fix["max_ratio_deviation"] < tolerance


# ---- figures ------------------------------------------------------------------------------------
def setting_label(row: dict) -> str:
    parts = ([f"k={row['top_k']}"] if row["top_k"] else []) + ([f"p={row['top_p']}"] if row["top_p"] < 1 else [])
    return " ".join(parts) or "off"


def plot_ratio_vs_kept_mass(ax, rows: list[dict]) -> None:
    """Mean first-step ratio against the kept mass S, one point per setting: the bug sits on ρ = S. The bug's points are
    large circles and the fix's small squares drawn over them, so a setting where both are 1 (no filter) shows both."""
    mass = [r["kept_mass"] for r in rows]
    ax.plot([min(mass), 1], [min(mass), 1], ":", color=plots.NEUTRAL_COLOR, label="ρ = S")
    for name, color, marker, label in (("bug", plots.BUG_COLOR, "o", "full softmax (bug)"),
                                       ("fix", plots.FIX_COLOR, "s", "same filters (fix)")):
        ax.plot(mass, [r[name]["mean_ratio"] for r in rows], marker, ms=9 if name == "bug" else 5, ls="none", color=color,
                label=label)
    for r in rows:  # top-k labels above left of the line, the others below right: settings with close S stay apart
        above = bool(r["top_k"])
        ax.annotate(setting_label(r), (r["kept_mass"], r["bug"]["mean_ratio"]), fontsize=8, xytext=(-5, 5) if above else (5, -12),
                    textcoords="offset points", ha="right" if above else "left")
    ax.set_xlabel("mean kept mass S")
    ax.set_ylabel("mean ratio ρ at lr 0")
    plots.legend_outside(ax, ncol=3)


def plot_clip_fraction(ax, rows: list[dict], clip_eps: float = 0.2) -> None:
    x = range(len(rows))
    for shift, name, label in ((-0.2, "bug", "full softmax (bug)"), (0.2, "fix", "same filters (fix)")):
        bars = ax.bar([i + shift for i in x], [r[name]["clip_fraction"] for r in rows], 0.4,
                      color=plots.bug_fix_color(name == "bug"), label=label)
        label_zero_bars(ax, bars)
    ax.set_xticks(list(x), [setting_label(r) for r in rows], rotation=45 if len(rows) > 5 else 0, fontsize=8)
    ax.set_xlabel("sampler setting")
    ax.set_ylabel(f"share with |ρ − 1| > {clip_eps}")  # the colours of the left panel's legend


def figure_ratio_vs_kept_mass(rows: list[dict]):
    """The notebook's figure: ``plot_ratio_vs_kept_mass`` and ``plot_clip_fraction`` side by side."""
    return plots.figure_panels((9.6, 4.2), lambda ax: plot_ratio_vs_kept_mass(ax, rows), lambda ax: plot_clip_fraction(ax, rows))


# ---- printers -----------------------------------------------------------------------------------
def sweep_lines(rows: list[dict]) -> str:
    """One line per filter setting: its kept mass S, the bug's mean ρ and clip share, the fix's largest |ρ − 1|."""
    return "\n".join(f"top_k={r['top_k']:>2} top_p={r['top_p']:.2f}: S = {r['kept_mass']:.4f}, mean ρ bug = {r['bug']['mean_ratio']:.4f} "
                     f"(max |ρ−S| {r['max_ratio_minus_mass']:.1e}, clipped {r['bug']['clip_fraction']:.1%}), "
                     f"fix max |ρ−1| = {r['fix']['max_ratio_deviation']:.1e}" for r in rows)


def caption_note(rows: list[dict], clip_eps: float = 0.2) -> str:
    """The caption under the figure: what each point and bar is."""
    return (f"Left: one point per sampler setting ({len(rows)}): the mean importance ratio ρ at learning rate 0 over the sampled "
            "tokens against the mean probability mass S the filters keep there (the bug's circles lie under the fix's squares "
            f"where both are 1). Right: share of sampled tokens with |ρ − 1| > {clip_eps}, outside the PPO clip range; a "
            "written 0 is a bar of height 0.")


def headline_sentence(head: dict) -> str:
    """The ``headline_row``'s ratio with full-softmax and with same-filter scoring."""
    return (f"Headline (top_k={head['top_k']}, top_p={head['top_p']}): mean ρ {head['bug']['mean_ratio']:.4f} with full-softmax scoring "
            f"(kept mass {head['kept_mass']:.4f}) → {head['fix']['mean_ratio']:.4f} with the same filters; "
            + ("ρ = S token by token." if verdict(head)[0] else "no measurable bias at this setting."))


# ---- explorer -----------------------------------------------------------------------------------
def filter_ratio_explorer(model, tokenizer, prompts: list[str], seed: int = 0) -> Explorer:
    """top-k / top-p / temperature controls redrawing the per-token ratio against S."""

    def draw(top_p, top_k, temperature):
        rollout = rollout_with_filters(model, tokenizer, prompts, top_k=top_k, top_p=top_p, temperature=temperature, seed=seed)
        logits, real = response_logits(model, rollout, temperature), rollout.response_mask.bool()
        mass = kept_mass(logits, top_k=top_k, top_p=top_p)[real]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for renormalise in (False, True):
            logp = rescore(logits, rollout.response_ids, top_k=top_k, top_p=top_p, renormalise=renormalise)
            ax.plot(mass, (logp - rollout.rollout_logprobs)[real].exp(), ".", color=plots.bug_fix_color(not renormalise),
                    label="same filters (fix)" if renormalise else "full softmax (bug)")
        ax.set_xlabel("kept mass S at the position")
        ax.set_ylabel("ρ at lr 0")
        plots.legend_outside(ax, "right")
        return {"kept_mass": float(mass.mean())}

    controls = {"top_p": widgets.FloatSlider(value=0.8, min=0.3, max=1.0, step=0.05, description="top_p"),
                "top_k": widgets.IntSlider(value=0, min=0, max=16, description="top_k (0 off)"),
                "temperature": widgets.FloatSlider(value=1.0, min=0.3, max=2.0, step=0.1, description="τ")}
    return Explorer(controls, draw, title="P14: per-token ratio at lr 0 against the kept mass")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(rows: list[dict], head: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 14 (``head``: ``headline_row(rows)``): the headline
    setting's verdict, fixed at every setting."""
    reproduced, fixed = verdict(head)
    return dict(
        notebook="14_truncated_sampling",
        reproduced=reproduced, fixed=fixed and all(verdict(r)[1] for r in rows),
        metrics={"settings": [{"top_k": r["top_k"], "top_p": r["top_p"], "kept_mass": r["kept_mass"],
                               "mean_ratio_bug": r["bug"]["mean_ratio"], "mean_ratio_fix": r["fix"]["mean_ratio"],
                               "clip_fraction_bug": r["bug"]["clip_fraction"],
                               "max_ratio_minus_mass": r["max_ratio_minus_mass"]} for r in rows]},
        headline={"what": f"mean importance ratio at lr 0 (top_k={head['top_k']}, top_p={head['top_p']})", "unit": "ratio",
                  "bug": head["bug"]["mean_ratio"], "fix": head["fix"]["mean_ratio"]},
    )
