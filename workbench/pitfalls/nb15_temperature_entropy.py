"""Pitfall P15: entropy and KL measured at a temperature other than the sampling one.

The policy that samples is π_τ = softmax(z / τ). Every quantity that describes it must be computed
from z / τ, yet trainers have computed some of them from the raw logits z:

* the entropy H(softmax(z)) instead of H(softmax(z / τ)): OpenRLHF's actor computed the entropy
  before dividing the logits by the temperature in place (fixed in PR #1319), so the logged entropy
  and the entropy bonus describe a distribution nobody samples from. For τ < 1 the sampled
  distribution is sharper (H(π_τ) < H(π_1)), for τ > 1 flatter;
* the reference log-probs at τ = 1 while the policy's are at τ (or the other way round: TRL's trainer
  did not divide by τ before #3029; vLLM returned raw-logit log-probs until TRL #4163). With the
  policy equal to the reference (step 0) the KL penalty should be exactly 0, but
  KL(π_τ ‖ π_ref,1) = Σ_v π_τ(v) (log π_τ(v) − log π_1(v)) > 0 for τ ≠ 1: a penalty that pushes the
  policy towards the τ = 1 version of itself.

The fix: divide the logits by the sampling temperature once, before every log-softmax and entropy.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from workbench.core.devices import model_device
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import entropy_from_logits, forward
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements -------------------------------------------------------------------------------
def entropy_at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """H(softmax(logits / τ)) in nats at every position."""
    return entropy_from_logits(logits.float() / temperature)


def kl_between_temperatures(logits: torch.Tensor, temperature: float, reference_temperature: float) -> torch.Tensor:
    """Exact KL(softmax(z / τ) ‖ softmax(z / τ_ref)) at every position, for the same logits z."""
    logp = F.log_softmax(logits.float() / temperature, -1)
    ref = F.log_softmax(logits.float() / reference_temperature, -1)
    return (logp.exp() * (logp - ref)).sum(-1)


@torch.no_grad()
def step0_measurements(model, tokenizer, prompts: list[str], *, temperature: float, seed: int = 0,
                       max_new_tokens: int = 6) -> dict:
    """At step 0 (policy = reference = ``model``), responses sampled at ``temperature``:

    ``entropy``: mean H of the sampled distribution (fix: logits / τ) and of the raw logits (bug);
    ``kl``: the per-token KL penalty k1 = log π_τ(a) − log π_ref(a) and k3, and the exact KL, with the
    reference scored at τ (fix) or at 1 (bug). All are means over real response tokens.
    """
    ids, mask = (t.to(model_device(model)) for t in encode_prompts(tokenizer, prompts))  # everything on the model's device
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                     generator=torch.Generator().manual_seed(seed))
    seq, seq_mask = rollout.sequences()
    logits = forward(model, seq, seq_mask)[:, ids.shape[1] - 1 : -1].float()
    real = rollout.response_mask.bool()
    actions = rollout.response_ids[..., None]
    policy_logp = F.log_softmax(logits / temperature, -1).gather(-1, actions).squeeze(-1)
    out = {"temperature": temperature, "tokens": int(real.sum())}
    for name, entropy_temperature, reference_temperature in (("bug", 1.0, 1.0), ("fix", temperature, temperature)):
        ref_logp = F.log_softmax(logits / reference_temperature, -1).gather(-1, actions).squeeze(-1)
        r = (policy_logp - ref_logp)[real]
        out[name] = {
            "entropy": float(entropy_at_temperature(logits, entropy_temperature)[real].mean()),
            "kl_k1": float(r.mean()),
            "kl_k3": float((torch.exp(-r) - 1 + r).mean()),
            "kl_exact": float(kl_between_temperatures(logits, temperature, reference_temperature)[real].mean()),
        }
    out["entropy_gap"] = out["bug"]["entropy"] - out["fix"]["entropy"]
    return out


# ---- sweeps -------------------------------------------------------------------------------------
def sweep(model, tokenizer, prompts: list[str], temperatures: list[float], **kwargs) -> list[dict]:
    return [step0_measurements(model, tokenizer, prompts, temperature=t, **kwargs) for t in temperatures]


def headline_row(rows: list[dict], headline_temperature: float) -> dict:
    """The ``sweep`` row whose temperature is nearest ``headline_temperature``."""
    return min(rows, key=lambda r: abs(r["temperature"] - headline_temperature))


# ---- verdict ------------------------------------------------------------------------------------
def verdict(rows: list[dict], tolerance: float = 1e-5) -> tuple[bool, bool]:
    """(reproduced, fixed): at some τ ≠ 1 the raw-logit entropy differs from the sampled one and the
    step-0 KL against a τ = 1 reference is not 0; with the fix both vanish at every τ."""
    off = [r for r in rows if abs(r["temperature"] - 1.0) > 1e-6]
    reproduced = any(abs(r["entropy_gap"]) > 100 * tolerance and r["bug"]["kl_exact"] > 100 * tolerance for r in off)
    fixed = all(abs(r["fix"]["kl_exact"]) < tolerance and abs(r["fix"]["kl_k1"]) < tolerance for r in rows)
    return reproduced, fixed


# ---- figures ------------------------------------------------------------------------------------
def plot_bug_and_fix(ax, rows: list[dict], key: str, labels: tuple[str, str], ylabel: str) -> None:
    """``key`` of the bug's and the fix's measurements against τ (``labels``: bug, fix), τ = 1 dotted: the two panels
    of the notebook's figure, drawn alike."""
    temperatures = [r["temperature"] for r in rows]
    ax.plot(temperatures, [r["bug"][key] for r in rows], "o-", color=plots.BUG_COLOR, label=labels[0])
    ax.plot(temperatures, [r["fix"][key] for r in rows], "s-", ms=4, color=plots.FIX_COLOR, label=labels[1])
    ax.axvline(1.0, color=plots.NEUTRAL_COLOR, lw=0.8, ls=":")
    ax.set_xlabel("sampling temperature τ")
    ax.set_ylabel(ylabel)
    plots.legend_outside(ax, ncol=2)


def plot_entropy(ax, rows: list[dict]) -> None:
    plot_bug_and_fix(ax, rows, "entropy", ("from z (bug)", "from z / τ (fix)"), "mean entropy (nats)")


def plot_step0_kl(ax, rows: list[dict]) -> None:
    """The exact step-0 KL per token on a linear axis: the fix's is 0 (to float rounding) at every τ, a line on the axis."""
    plot_bug_and_fix(ax, rows, "kl_exact", ("reference at τ = 1 (bug)", "reference at τ (fix)"),
                     "exact KL at step 0 (nats/token)")


def figure_entropy_vs_temperature(rows: list[dict]):
    """The notebook's figure: ``plot_entropy`` and ``plot_step0_kl`` side by side."""
    return plots.figure_panels((9.6, 4.0), lambda ax: plot_entropy(ax, rows), lambda ax: plot_step0_kl(ax, rows))


# ---- printers -----------------------------------------------------------------------------------
def sweep_lines(rows: list[dict]) -> str:
    """One line per temperature: the entropy of the raw and of the sampled distribution and their gap; the step-0
    KL with the reference at τ = 1 (exact, k1, k3 — the bug) and at τ (exact — the fix)."""
    return "\n".join(f"τ={r['temperature']:4}: entropy raw {r['bug']['entropy']:.4f} vs sampled {r['fix']['entropy']:.4f} nats "
                     f"(gap {r['entropy_gap']:+.4f}); step-0 KL bug exact {r['bug']['kl_exact']:.2e}, k1 {r['bug']['kl_k1']:+.2e}, "
                     f"k3 {r['bug']['kl_k3']:.2e}; fix exact {r['fix']['kl_exact']:.1e}" for r in rows)


def caption_note(rows: list[dict]) -> str:
    """The caption under the figure: what each panel draws, and the fix's largest step-0 KL (0 up to float rounding)."""
    fix_kl = max(abs(r["fix"]["kl_exact"]) for r in rows)
    return ("Left: mean entropy at the sampled positions, computed from the raw logits z (bug) or from z / τ, the "
            "distribution that samples (fix); they meet at τ = 1 (dotted). Right: exact KL(π_τ ‖ π_ref) per token at step 0, "
            "where policy and reference are the same model; the fix's is "
            + ("exactly 0 at every τ." if fix_kl == 0 else f"at most {fix_kl:.1e} nats/token (0 up to float rounding) at every τ."))


def headline_sentence(rows: list[dict], head: dict) -> str:
    """The ``headline_row``'s entropy gap and step-0 KL, and whether the fix removes both at every temperature."""
    return (f"At τ = {head['temperature']}: the logged entropy is off by {abs(head['entropy_gap']):.4f} nats "
            f"({abs(head['entropy_gap']) / head['fix']['entropy']:.0%} of the true {head['fix']['entropy']:.4f}) and the step-0 KL is "
            f"{head['bug']['kl_exact']:.2e} nats/token instead of 0; "
            + ("both vanish with the fix." if verdict(rows)[1] else "the fix leaves a residue."))


# ---- explorer -----------------------------------------------------------------------------------
def last_position_logits(model, tokenizer, prompt: str) -> torch.Tensor:
    """The next-token logits after ``prompt`` (the explorer's one context)."""
    ids, mask = encode_prompts(tokenizer, [prompt])
    return forward(model, ids, mask)[0, -1].detach()  # forward returns the logits (B, T, V)


def entropy_temperature_explorer(logits: torch.Tensor) -> Explorer:
    """A τ slider redrawing one context's next-token distribution at τ and at 1, with both entropies."""

    def draw(temperature):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        order = logits.argsort(descending=True)[:12]
        panels = ((-0.2, 1.0, plots.BUG_COLOR, "softmax(z)"), (0.2, temperature, plots.FIX_COLOR, "softmax(z/τ)"))
        entropies = []
        for shift, t, color, name in panels:
            probs = F.softmax(logits.float() / t, -1)[order]
            entropies.append(entropy_at_temperature(logits, t))
            ax.bar([i + shift for i in range(len(order))], probs.tolist(), 0.4, color=color,
                   label=f"{name}: H = {float(entropies[-1]):.3f} nats")
        ax.set_xlabel("token rank")
        ax.set_ylabel("probability")
        ax.legend()
        raw, sampled = entropies
        return {"entropy_gap": float(raw - sampled)}

    slider = widgets.FloatSlider(value=0.7, min=0.2, max=2.0, step=0.05, description="τ")
    return Explorer({"temperature": slider}, draw, title="P15: the distribution you sample vs the one you measure")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(rows: list[dict], head: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 15 (``head``: the ``headline_row``)."""
    reproduced, fixed = verdict(rows)
    return dict(
        notebook="15_temperature_entropy", reproduced=reproduced, fixed=fixed,
        metrics={"entropy_gap_at_headline_temperature": head["entropy_gap"],
                 "entropy_raw": {str(r["temperature"]): r["bug"]["entropy"] for r in rows},
                 "entropy_sampled": {str(r["temperature"]): r["fix"]["entropy"] for r in rows},
                 "step0_kl_exact_bug": {str(r["temperature"]): r["bug"]["kl_exact"] for r in rows},
                 "step0_kl_k3_bug": {str(r["temperature"]): r["bug"]["kl_k3"] for r in rows},
                 "step0_kl_exact_fix": {str(r["temperature"]): r["fix"]["kl_exact"] for r in rows}},
        headline={"what": f"KL(policy ‖ reference) at step 0, where they are the same model (τ = {head['temperature']})",
                  "unit": "nats/token", "bug": head["bug"]["kl_exact"], "fix": head["fix"]["kl_exact"]},
    )
