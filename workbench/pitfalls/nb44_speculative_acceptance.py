"""Pitfall P44: speculative decoding in rollouts with an acceptance rule that does not preserve the target policy.

A rollout engine with speculative decoding lets a small draft model q propose tokens and the policy (the target p)
verify them. Exact rejection sampling (Leviathan et al. 2023, Chen et al. 2023; vLLM's rejection sampler, PR #2336)
accepts a drafted x with probability min(1, p(x)/q(x)) and on rejection draws from norm(max(p − q, 0)): every emitted
token is distributed exactly as p. Faster rules break that: *typical acceptance* (Medusa; vLLM PR #5131, issue
#5015: accept x when p(x) > min(ε, δ·e^{−H(p)}), else emit argmax p) favours the modes; *resampling from p* on
rejection (instead of the residual: Spec-RL issue #14) counts the tokens both models like twice. The engine still
reports the *target's* log-probabilities of the tokens it emitted (vLLM PR #4378), and the trainer recomputes the same
ones, so ρ = π_θ / π_old is exactly 1 at step 0 — no importance correction can see that the samples came from

    out(x) = q(x)·a(x) + (1 − Σ_y q(y)·a(y))·r(x)  ≠  p(x)     (a: the acceptance probability, r: the rejection draw).

This module computes ``out`` exactly for each rule at real contexts (policy ``tiny-arith-qwen2``, draft
``tiny-arith-gpt2``: the same tokenizer), runs the acceptance procedure by Monte Carlo, and measures the total-variation
distance of the emitted tokens from p against the noise floor of sampling p directly, over seeds.
"""

from __future__ import annotations

import math
import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core.errors import ModelLoadError
from workbench.experiments.checkpoints import load
from workbench.modeling.models import check_same_tokenizer
from workbench.modeling.perturbation import perturbed_copy
from workbench.modeling.rollout import sample
from workbench.tasks import all_problems
from workbench.tasks.encoding import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer

RULES = ("rejection", "typical", "resample_target")
RULE_LABELS = {"rejection": "exact rejection sampling", "typical": "typical acceptance",
               "resample_target": "reject → resample from p"}
POSTERIOR_THRESHOLD, POSTERIOR_ALPHA = 0.09, 0.3  # ε, δ of typical acceptance: vLLM's defaults (PR #5131)
TINY_DRAFT = "tiny-arith-gpt2"  # a smaller-context GPT-2-style model trained on the same task: the tiny policy's draft
DRAFT_DRIFT = 0.05  # weight noise of a draft made from the policy itself, for checkpoints without a tiny draft


# ---- measurements -------------------------------------------------------------------------------
def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error over seeds (s.e. 0 for one seed)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def load_draft(draft_model: str, model: str, policy, *, seed: int = 0, **options):
    """``(draft, name)``: ``draft_model`` loaded; with ``"auto"``, ``TINY_DRAFT`` when it shares ``model``'s
    tokenizer, else the policy with ``DRAFT_DRIFT`` × N(0, 1) noise on every weight (same tokenizer by construction)."""
    if draft_model == "auto":
        try:
            check_same_tokenizer(model, TINY_DRAFT)
        except ModelLoadError:
            return perturbed_copy(policy, DRAFT_DRIFT, seed=seed), f"{model} perturbed by {DRAFT_DRIFT} × N(0, 1)"
        draft_model = TINY_DRAFT
    check_same_tokenizer(model, draft_model)  # a draft proposes the target's token ids: same tokenizer or a clear error
    draft, _ = load(draft_model, **options)
    return draft, draft_model


@torch.no_grad()
def step_distributions(target, draft, tokenizer, n_prompts: int, *, temperature: float = 1.0, max_new_tokens: int = 4,
                       seed: int = 0) -> dict:
    """Target and draft next-token distributions (at ``temperature``) at every response position of target-sampled
    answers to ``n_prompts`` arithmetic questions: ``{"p": (C, V), "q": (C, V), "prompts": [...]}``."""
    prompts = [p.prompt for p in random.Random(seed).sample(all_problems(), n_prompts)]
    ids, mask = encode_prompts(tokenizer, prompts)
    ids, mask = ids.to(next(target.parameters()).device), mask.to(next(target.parameters()).device)
    rollout = sample(target, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, temperature=temperature,
                     generator=torch.Generator().manual_seed(seed))
    full = torch.cat([ids, rollout.response_ids], 1)
    full_mask = torch.cat([mask, rollout.response_mask], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    width = ids.shape[1]
    keep = rollout.response_mask.bool().reshape(-1).cpu()
    out = {}
    for name, model in (("p", target), ("q", draft)):
        logits = model(input_ids=full, attention_mask=full_mask, position_ids=positions).logits.float()
        logits = logits[:, width - 1 : -1] / temperature  # the distribution each response token was drawn from
        out[name] = torch.softmax(logits, -1).reshape(-1, logits.shape[-1]).cpu()[keep]  # Monte Carlo runs on the CPU
    out["prompts"] = prompts
    return out


def acceptance(p: torch.Tensor, q: torch.Tensor, rule: str, *, threshold: float = POSTERIOR_THRESHOLD,
               alpha: float = POSTERIOR_ALPHA) -> torch.Tensor:
    """a(x): the probability that a drafted token x is accepted, per context (C, V)."""
    if rule in ("rejection", "resample_target"):
        return torch.where(q > 0, (p / q.clamp(min=1e-30)).clamp(max=1.0), torch.zeros_like(p))
    if rule == "typical":
        entropy = -(p * p.clamp(min=1e-30).log()).sum(-1, keepdim=True)
        return (p > torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))).to(p.dtype)
    raise ValueError(f"unknown acceptance rule {rule!r}; choose one of {RULES}")


def rejection_draw(p: torch.Tensor, q: torch.Tensor, rule: str) -> torch.Tensor:
    """r(x): the distribution a rejected position is drawn from (C, V)."""
    if rule == "rejection":
        residual = (p - q).clamp(min=0)
        total = residual.sum(-1, keepdim=True)
        return torch.where(total > 0, residual / total.clamp(min=1e-30), p)  # p = q: never rejected, any r will do
    if rule == "resample_target":
        return p
    if rule == "typical":
        return torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).to(p.dtype)
    raise ValueError(f"unknown acceptance rule {rule!r}; choose one of {RULES}")


def emitted_distribution(p: torch.Tensor, q: torch.Tensor, rule: str) -> dict:
    """The exact distribution of the emitted token, ``out = q·a + (1 − Σ q·a)·r``, and the acceptance rate Σ q·a."""
    a = acceptance(p, q, rule)
    accepted = (q * a).sum(-1, keepdim=True)
    return {"out": q * a + (1 - accepted) * rejection_draw(p, q, rule), "acceptance_rate": accepted.squeeze(-1)}


def total_variation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * (a - b).abs().sum(-1)


def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(a ‖ b) per row, 0·log 0 = 0."""
    return torch.where(a > 0, a * (a.clamp(min=1e-30).log() - b.clamp(min=1e-30).log()), torch.zeros_like(a)).sum(-1)


def simulate(p: torch.Tensor, q: torch.Tensor, rule: str, trials: int, generator: torch.Generator) -> torch.Tensor:
    """Run the acceptance procedure ``trials`` times per context — draft x ~ q, accept with probability a(x), else
    draw from r — and return the emitted tokens' frequencies (C, V)."""
    a, r = acceptance(p, q, rule), rejection_draw(p, q, rule)
    drafted = torch.multinomial(q, trials, replacement=True, generator=generator)
    accept = torch.rand(drafted.shape, generator=generator) < a.gather(-1, drafted)
    redrawn = torch.multinomial(r, trials, replacement=True, generator=generator)
    emitted = torch.where(accept, drafted, redrawn)
    return torch.zeros_like(p).scatter_add_(-1, emitted, torch.ones_like(emitted, dtype=p.dtype)) / trials


def direct_frequencies(p: torch.Tensor, trials: int, generator: torch.Generator) -> torch.Tensor:
    """Frequencies of ``trials`` tokens drawn from p directly: the noise floor of the empirical TV."""
    drawn = torch.multinomial(p, trials, replacement=True, generator=generator)
    return torch.zeros_like(p).scatter_add_(-1, drawn, torch.ones_like(drawn, dtype=p.dtype)) / trials


# ---- sweeps -------------------------------------------------------------------------------------
def rule_effects(dists: dict, trials: int, seeds: list[int]) -> dict:
    """Per rule: exact TV and KL from p (mean over contexts), acceptance rate, the mean reported log-prob shift
    E_out[log p] − E_p[log p]; and the empirical TV of ``trials`` Monte-Carlo draws per context, per seed, with the
    direct-sampling noise floor — mean ± s.e. over seeds."""
    p, q = dists["p"], dists["q"]
    log_p = p.clamp(min=1e-30).log()
    floor = [float(total_variation(direct_frequencies(p, trials, torch.Generator().manual_seed(1000 + s)), p).mean())
             for s in seeds]
    effects = {"contexts": p.shape[0], "trials": trials, "seeds": list(seeds), "floor": floor,
               "floor_mean": mean_and_se(floor)[0], "floor_se": mean_and_se(floor)[1], "rules": {}}
    for rule in RULES:
        exact = emitted_distribution(p, q, rule)
        empirical = [float(total_variation(simulate(p, q, rule, trials, torch.Generator().manual_seed(s)), p).mean())
                     for s in seeds]
        effects["rules"][rule] = {
            "tv_exact": float(total_variation(exact["out"], p).mean()),
            "tv_exact_per_context": total_variation(exact["out"], p),
            "kl_exact": float(kl(exact["out"], p).mean()),
            "acceptance_rate": float(exact["acceptance_rate"].mean()),
            "reported_logprob_shift": float(((exact["out"] - p) * log_p).sum(-1).mean()),
            "tv_empirical": empirical, "tv_empirical_mean": mean_and_se(empirical)[0],
            "tv_empirical_se": mean_and_se(empirical)[1],
        }
    return effects


def headline_rule(effects: dict, acceptance_rule: str) -> str:
    """The rule the notebook reports as the bug: the chosen non-preserving one (``rejection`` falls back to typical)."""
    return acceptance_rule if acceptance_rule != "rejection" else "typical"


# ---- verdict ------------------------------------------------------------------------------------
def verdict(effects: dict, bug_rule: str = "typical", *, signature: float = 0.01, sigmas: float = 4.0) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: the bug rule's emitted tokens are further from p than the direct-sampling noise floor
    by ``sigmas`` standard errors and its exact TV exceeds ``signature``; exact rejection sampling's exact TV is
    ≤ 1e-5 and its empirical TV lies within ``sigmas`` s.e. of the floor."""
    bug, fix = effects["rules"][bug_rule], effects["rules"]["rejection"]
    se = math.hypot(bug["tv_empirical_se"], effects["floor_se"]) or 1e-12
    reproduced = bug["tv_exact"] > signature and bug["tv_empirical_mean"] - effects["floor_mean"] > sigmas * se
    fix_se = math.hypot(fix["tv_empirical_se"], effects["floor_se"]) or 1e-12
    fixed = fix["tv_exact"] <= 1e-5 and abs(fix["tv_empirical_mean"] - effects["floor_mean"]) <= sigmas * fix_se
    return reproduced, fixed


def not_shown(effects: dict, bug_rule: str = "typical") -> str | None:
    """Why the checkpoints could not show the bug (``None`` when ``verdict`` reproduced it)."""
    if verdict(effects, bug_rule)[0]:
        return None
    bug = effects["rules"][bug_rule]
    return (f"{RULE_LABELS[bug_rule]} moves the emitted distribution by only TV {bug['tv_exact']:.3g} from the target's "
            f"(noise floor {effects['floor_mean']:.3g} at {effects['trials']} draws per context): a draft that agrees "
            "with the target leaves little to distort — use a draft trained less (tiny-arith-gpt2) or raise trials")


# ---- figures ------------------------------------------------------------------------------------
def _rule_color(rule: str, bug_rule: str) -> str:
    return plots.FIX_COLOR if rule == "rejection" else plots.BUG_COLOR if rule == bug_rule else plots.SERIES_COLORS[2]


def plot_tv(ax, effects: dict, bug_rule: str = "typical") -> None:
    """Each rule's empirical TV from p (mean ± s.e. over seeds) and its exact TV (×), against the noise floor."""
    for i, rule in enumerate(RULES):
        r = effects["rules"][rule]
        ax.bar(i, r["tv_empirical_mean"], yerr=r["tv_empirical_se"], color=_rule_color(rule, bug_rule), capsize=3)
        ax.plot(i, r["tv_exact"], "x", color="black", ms=6, label="exact TV" if i == 0 else None)
    ax.axhline(effects["floor_mean"], color=plots.NEUTRAL_COLOR, ls="--", lw=1, label="noise floor (draws from p)")
    ax.set_xticks(range(len(RULES)), ["rejection\n(fix)", "typical\n(bug)", "resample p\n(bug)"])
    ax.set(ylabel="TV(emitted, target)")
    plots.legend_outside(ax, ncol=1)


def plot_context(ax, p: torch.Tensor, q: torch.Tensor, tokenizer, rule: str, top: int = 6) -> None:
    """One context: the target p, the draft q and the emitted distribution under ``rule``, over p's top tokens."""
    out = emitted_distribution(p[None], q[None], rule)["out"][0]
    tokens = p.argsort(descending=True)[:top]
    x = torch.arange(len(tokens)).float()
    ax.bar(x - 0.27, p[tokens].numpy(), 0.27, color=plots.NEUTRAL_COLOR, label="target p")
    ax.bar(x, q[tokens].numpy(), 0.27, color=plots.SERIES_COLORS[1], label="draft q")
    ax.bar(x + 0.27, out[tokens].numpy(), 0.27, color=_rule_color(rule, rule if rule != "rejection" else ""),
           label=f"emitted: {RULE_LABELS[rule]}")
    ax.set_xticks(x.tolist(), [repr(t) for t in tokenizer.convert_ids_to_tokens(tokens.tolist())])
    ax.set(ylabel="probability", xlabel="token (target's most likely first)")


def figure_speculative(effects: dict, dists: dict, tokenizer, bug_rule: str = "typical"):
    """The notebook's figure: TV per rule (left); the most distorted context under the bug rule (right)."""
    fig, axes = plots.panel_grid(2, panel_height=3.4)
    plot_tv(axes[0], effects, bug_rule)
    worst = int(effects["rules"][bug_rule]["tv_exact_per_context"].argmax())
    plot_context(axes[1], dists["p"][worst], dists["q"][worst], tokenizer, bug_rule)
    plots.legend_outside(axes[1], ncol=2)
    return fig


# ---- printers -----------------------------------------------------------------------------------
def effects_lines(effects: dict) -> str:
    lines = [f"{effects['contexts']} contexts, {effects['trials']} draws each, seeds {effects['seeds']}: noise floor TV "
             f"{effects['floor_mean']:.4f} ± {effects['floor_se']:.4f}"]
    for rule in RULES:
        r = effects["rules"][rule]
        lines.append(f"{RULE_LABELS[rule]:>26}: TV exact {r['tv_exact']:.4f}, empirical {r['tv_empirical_mean']:.4f} ± "
                     f"{r['tv_empirical_se']:.4f}; KL {r['kl_exact']:.4f} nats; acceptance {r['acceptance_rate']:.1%}; "
                     f"reported log-prob shift {r['reported_logprob_shift']:+.3f} nats/token")
    return "\n".join(lines)


def tv_note() -> str:
    return ("bars: TV of the emitted tokens' frequencies from p, mean ± s.e. over seeds; ×: the exact TV; dashed: the TV "
            "of as many direct draws from p. The trainer's ratio is 1 for every rule: it sees only p.")


# ---- explorer -----------------------------------------------------------------------------------
def context_explorer(dists: dict, tokenizer) -> Explorer:
    """P44: the target, draft and emitted distributions at one context under each rule."""

    def draw(context, rule):
        fig, ax = plt.subplots(figsize=(9, 3.4))
        p, q = dists["p"][context], dists["q"][context]
        plot_context(ax, p, q, tokenizer, rule)
        plots.legend_outside(ax, ncol=3)
        tv = float(total_variation(emitted_distribution(p[None], q[None], rule)["out"][0], p))
        return {"context": context, "rule": rule, "tv": tv}

    controls = {"context": widgets.IntSlider(value=0, min=0, max=dists["p"].shape[0] - 1, description="context"),
                "rule": widgets.Dropdown(options=list(RULES), value="typical", description="rule")}
    return Explorer(controls, draw, "P44: one speculative step")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(effects: dict, bug_rule: str = "typical") -> dict:
    """Notebook 44's ``notebook_api.write_metrics`` keyword arguments (per-context tensors stay out)."""
    reproduced, fixed = verdict(effects, bug_rule)
    rules = {rule: {k: v for k, v in r.items() if not isinstance(v, torch.Tensor)} for rule, r in effects["rules"].items()}
    return {
        "notebook": "44_speculative_acceptance", "reproduced": reproduced, "fixed": fixed,
        "not_shown": not_shown(effects, bug_rule),
        "metrics": {**{k: v for k, v in effects.items() if k != "rules"}, "bug_rule": bug_rule, "rules": rules},
        "headline": {"what": "exact TV of the emitted tokens from the target policy", "unit": "TV",
                     "bug": effects["rules"][bug_rule]["tv_exact"], "fix": effects["rules"]["rejection"]["tv_exact"]},
    }
