"""Pitfall P30: a mixture-of-experts router that picks different experts in the rollout engine and in the trainer.

A sparse MoE layer sends each token to the top-k experts of a linear router. The rollout engine (bf16, its own kernels and
batch layout) and the trainer (fp32) run the same weights, but wherever the k-th and (k+1)-th router probabilities nearly
tie, rounding flips the choice: the trainer then scores a sampled token through other experts than the ones that produced
it, and its log-prob differs by far more than the bf16 rounding of a dense model (P12). Megatron-LM (PR #2101, #4256)
measured ~10 % of routers disagreeing per forward and ~94 % of tokens differing in at least one layer on Qwen3-30B-A3B;
GRPO runs collapsed. Rollout routing replay (R3, arXiv 2510.11370; Megatron ``moe_enable_routing_replay``, slime PR #387,
NeMo-RL PR #2590) records the engine's expert indices and forces them in the training forward; the weights of the forced
experts are recomputed from the trainer's own router logits (softmax at those experts, renormalised when the model
renormalises), so the router keeps its gradient.

Here a bf16 copy of the model samples responses and scores them (its log-probs μ and routes recorded in one forward over
the sampled sequences, as an engine's prefill would), and the fp32 trainer scores the same sequences twice: routing by
itself (bug) and replaying the engine's routes (fix, ``workbench.modeling.routing_replay``). Measured: per layer and
overall, the share of tokens whose top-k expert *set* differs from the engine's; the share differing in at least one
layer; |log μ − log π| per response token both ways; and the router's top-k margin at the flipped routes.
"""

from __future__ import annotations

import copy
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.modeling.rollout import sample
from workbench.modeling.routing_replay import (
    RoutingHooks,
    declared_experts,
    is_topk_router,
    moe_routers,
    route_disagreement,
    topk_margin,
)
from workbench.modeling.scoring import token_logprobs
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars

ROUTINGS = ("replay", "recompute")  # the fix (R3: the engine's routes forced in the trainer), the bug (the trainer routes itself)
ROUTING_STYLES = {"replay": (plots.FIX_COLOR, "routes replayed (fix, R3)"), "recompute": (plots.BUG_COLOR, "routes recomputed (bug)")}
MIN_GAP = 1e-3  # nats per token: the smallest mean |log μ − log π| called a log-prob mismatch
Z = 2.0  # standard errors by which replay must lower the mismatch for the route flips to count as its cause
DEEP_MODEL_LAYERS = 48  # Qwen3-30B-A3B's MoE layers, for the "at least one layer" extrapolation


# ---- measurements --------------------------------------------------------------------------------
@torch.no_grad()
def router_mismatch(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 8, seed: int = 0,
                    sampler_dtype: torch.dtype = torch.bfloat16) -> dict:
    """A ``sampler_dtype`` copy of ``model`` samples and scores responses to ``prompts``; an fp32 copy (the trainer)
    scores the same sequences routing by itself and replaying the sampler's routes. Route disagreement is counted over
    every real token (prompt and response) and MoE layer, the log-prob gap over response tokens."""
    moe_routers(model)  # a dense or unsupported model: its error, naming the model type, before any sampling
    trainer = model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
    engine = copy.deepcopy(model).to(sampler_dtype)
    ids, mask = encode_prompts(tokenizer, prompts)
    bar = progress.bar(4, "sample, then score: sampler, trainer, trainer replaying", unit="pass")
    rollout = sample(engine, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    bar.update(1)
    sequences = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    sequence_mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
    with RoutingHooks(engine, "record") as sampler:
        logp = {"sampler": token_logprobs(engine, sequences, sequence_mask)}
    bar.update(1)
    with RoutingHooks(trainer, "record") as recomputed:
        logp["recompute"] = token_logprobs(trainer, sequences, sequence_mask)
    bar.update(1)
    with RoutingHooks(trainer, "replay", sampler.routes) as replayed:
        logp["replay"] = token_logprobs(trainer, sequences, sequence_mask)
    bar.update(1)
    bar.close()
    response = torch.zeros_like(sequence_mask[:, 1:])  # target t is scored at position t − 1
    response[:, rollout.prompt_ids.shape[1] - 1:] = rollout.response_mask
    response = response.bool()
    differ = {"recompute": route_disagreement(sampler.routes, recomputed.routes, sequence_mask),
              "replay": route_disagreement(sampler.routes, replayed.routes, sequence_mask)}
    top_k = {name: router.top_k for name, router in recomputed.routers.items()}
    margin = topk_margin(recomputed.logits, top_k).cpu()[sequence_mask.reshape(-1).bool().cpu()]
    log_ratio = {r: (logp[r] - logp["sampler"])[response].cpu() for r in ROUTINGS}  # log π_trainer − log μ_sampler
    return {
        "model_type": trainer.config.model_type, "layers": list(sampler.routes),
        "experts": next(iter(recomputed.routers.values())).num_experts, "top_k": next(iter(top_k.values())),
        "renormalised": all(recomputed.renormalised.values()),
        "tokens": int(sequence_mask.sum()), "response_tokens": int(response.sum()),
        "differ": {r: d.cpu() for r, d in differ.items()}, "margin": margin.cpu(), "log_ratio": log_ratio,
        "replayed_identical": all(torch.equal(replayed.routes[n], sampler.routes[n]) for n in sampler.routes),
        **summarise(differ, log_ratio),
    }


def summarise(differ: dict[str, torch.Tensor], log_ratio: dict[str, torch.Tensor]) -> dict:
    """The numbers of ``router_mismatch`` from its (tokens, layers) disagreement masks and per-token log-ratios."""
    out = {"routing": {}}
    for routing in ROUTINGS:
        d, gap = differ[routing].float(), log_ratio[routing].abs()
        out["routing"][routing] = {
            "per_layer": d.mean(0).tolist(), "router_disagreement": float(d.mean()), "any_layer": float(d.amax(-1).mean()),
            "cumulative_any_layer": [float(d[:, :i + 1].amax(-1).mean()) for i in range(d.shape[1])],
            "mean_gap": float(gap.mean()), "p99_gap": float(gap.quantile(0.99)), "max_gap": float(gap.max())}
    reduction = log_ratio["recompute"].abs() - log_ratio["replay"].abs()  # paired over the same response tokens
    out["gap_reduction"] = float(reduction.mean())
    out["gap_reduction_se"] = float(reduction.std() / math.sqrt(reduction.numel())) if reduction.numel() > 1 else math.inf
    per_layer = out["routing"]["recompute"]["per_layer"]
    out["independent_any_layer"] = 1 - math.prod(1 - p for p in per_layer)
    mean_rate = sum(per_layer) / len(per_layer)
    out["deep_model_any_layer"] = 1 - (1 - mean_rate) ** DEEP_MODEL_LAYERS
    return out


# ---- verdict -------------------------------------------------------------------------------------
def dense_reason(model) -> str | None:
    """Why this checkpoint cannot show P30 (a dense model has no router), or None."""
    if any(is_topk_router(m) for m in model.modules()) or declared_experts(model):
        return None  # an MoE (an unsupported router is routing_replay's error, with its model type)
    return (f"{type(model).__name__} (model_type {model.config.model_type!r}) is a dense model: it has no mixture-of-experts "
            "router, so there is no route to disagree on; use an MoE checkpoint (the built-in tiny-mixtral, or a local "
            "Mixtral / Qwen2-MoE / Qwen3-MoE / OLMoE folder)")


def verdict(result: dict, *, min_gap: float = MIN_GAP, z: float = Z) -> tuple[bool, bool]:
    """(reproduced, fixed).

    Reproduced: the trainer routing by itself picks another expert set than the sampler for some (token, layer)
    (share > 0), its mean |log μ − log π| exceeds ``min_gap``, and the flips measurably add to it: the same trainer
    replaying the sampler's routes is closer to μ by more than ``z`` standard errors of the paired per-token difference.
    Fixed: with replay every route equals the sampler's (share exactly 0, indices identical) and the mean gap is below
    the gap with the trainer's own routes; what remains is the bf16 arithmetic (P12)."""
    bug, fix = result["routing"]["recompute"], result["routing"]["replay"]
    reproduced = (bug["router_disagreement"] > 0 and bug["mean_gap"] > min_gap
                  and result["gap_reduction"] > z * result["gap_reduction_se"])
    fixed = fix["router_disagreement"] == 0 and result["replayed_identical"] and fix["mean_gap"] < bug["mean_gap"]
    return bool(reproduced), bool(fixed)


def not_shown(result: dict, *, z: float = Z) -> str | None:
    """Why this sample shows no router mismatch (no route flipped, or flips that moved no scored log-prob beyond the
    noise), or None."""
    bug = result["routing"]["recompute"]
    if bug["router_disagreement"] == 0:
        return (f"no route of {result['tokens']} tokens × {len(result['layers'])} MoE layers differs between the bf16 "
                "sampler and the fp32 trainer: the routers' top-k choices are far from ties here; raise n_prompts or "
                "max_new_tokens")
    if result["gap_reduction"] <= z * result["gap_reduction_se"]:
        return (f"{bug['router_disagreement']:.2%} of routes differ, but replaying them changes the mean log-prob gap by "
                f"only {result['gap_reduction']:.1e} ± {result['gap_reduction_se']:.1e} (≤ {z:g} standard errors): the flips "
                "sit where they barely move a scored token (late layers, last positions); raise n_prompts or max_new_tokens")
    return None


# ---- figures -------------------------------------------------------------------------------------
def plot_layer_disagreement(ax, result: dict) -> None:
    """Share of tokens whose top-k expert set differs from the sampler's, per MoE layer and in at least one layer."""
    labels = [str(i) for i in range(len(result["layers"]))] + ["≥ 1"]
    x = list(range(len(labels)))
    for offset, routing in ((-0.2, "recompute"), (0.2, "replay")):
        s = result["routing"][routing]
        color, label = ROUTING_STYLES[routing]
        bars = ax.bar([i + offset for i in x], [100 * v for v in s["per_layer"] + [s["any_layer"]]], 0.4, color=color, label=label)
        label_zero_bars(ax, bars)
    independent = 100 * result["independent_any_layer"]
    ax.hlines(independent, x[-1] - 0.45, x[-1] + 0.45, color=plots.NEUTRAL_COLOR, ls=":", lw=2,
              label="≥ 1 layer if layers flipped independently")
    top = max(100 * result["routing"]["recompute"]["any_layer"], independent)
    ax.set_ylim(0, 1.3 * top if top > 0 else 1)
    ax.set_xticks(x, labels)
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("tokens on other experts (%)")
    ax.set_title("routes that differ", fontsize=10)


def gap_bins(result: dict, n: int = 40):
    """``n`` log-spaced histogram edges over every response token's |log-ratio| under both routings, and the lowest
    edge (the smallest positive gap), where ``plot_gap`` puts the exact zeros."""
    gaps = torch.cat([result["log_ratio"][r].abs() for r in ROUTINGS])
    low = max(float(gaps[gaps > 0].min()) if (gaps > 0).any() else 1e-8, 1e-8)
    return torch.logspace(math.log10(low), math.log10(max(float(gaps.max()), 10 * low)), n).numpy(), low


def plot_gap(ax, result: dict) -> None:
    """Histogram of |log μ_sampler − log π_trainer| per response token, routes recomputed vs replayed (log axes)."""
    edges, low = gap_bins(result)
    for routing in ("recompute", "replay"):
        color, label = ROUTING_STYLES[routing]
        ax.hist(result["log_ratio"][routing].abs().clamp(min=low).numpy(), bins=edges, color=color, alpha=0.55, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("|log μ − log π| (nats)")
    ax.set_ylabel("tokens")
    ax.set_title("per response token", fontsize=10)


def plot_margin(ax, result: dict, layer: int | None = None, routing: str = "recompute") -> None:
    """The trainer's router margin p_k − p_(k+1) at each (token, layer): routes kept (grey) vs flipped against the sampler
    (the routing's colour)."""
    differ, margin = result["differ"][routing], result["margin"]
    if layer is not None:
        differ, margin = differ[:, layer], margin[:, layer]
    differ, margin = differ.reshape(-1), margin.reshape(-1).clamp(min=1e-7)
    edges = torch.logspace(-7, 0, 36).numpy()
    ax.hist(margin[~differ].numpy(), bins=edges, color=plots.NEUTRAL_COLOR, alpha=0.5, label="same experts")
    if differ.any():
        ax.hist(margin[differ].numpy(), bins=edges, color=ROUTING_STYLES[routing][0], alpha=0.9, label="other experts")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("router margin p_k − p_(k+1)")
    ax.set_ylabel("(token, layer) routes")
    ax.set_title("every MoE layer" if layer is None else f"layer {layer}", fontsize=10)


def figure_router_mismatch(result: dict):
    """The notebook's figure: disagreement per layer, the log-prob gap both ways, the margin at flipped routes; one
    legend under them (``router_note`` is the caption)."""
    from matplotlib.patches import Patch  # matplotlib: only when a figure is drawn

    fig = plots.figure_panels((plots.NOTEBOOK_WIDTH, 3.0), lambda ax: plot_layer_disagreement(ax, result),
                              lambda ax: plot_gap(ax, result), lambda ax: plot_margin(ax, result))
    handles, labels = fig.axes[0].get_legend_handles_labels()
    handles.append(Patch(color=plots.NEUTRAL_COLOR, alpha=0.5))
    labels.append("routes on the same experts (right)")
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=9)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def result_lines(result: dict) -> str:
    lines = [f"{result['model_type']}: {len(result['layers'])} MoE layers, {result['experts']} experts, top-{result['top_k']}"
             f" ({'renormalised' if result['renormalised'] else 'not renormalised'}); {result['tokens']} tokens, "
             f"{result['response_tokens']} of them sampled"]
    for routing in ("recompute", "replay"):
        s = result["routing"][routing]
        lines.append(f"{ROUTING_STYLES[routing][1]}: per layer {', '.join(f'{p:.1%}' for p in s['per_layer'])} of tokens on "
                     f"another expert set ({s['router_disagreement']:.2%} of routes), {s['any_layer']:.1%} in ≥ 1 layer; "
                     f"|log μ − log π| mean {s['mean_gap']:.2e}, p99 {s['p99_gap']:.2e}, max {s['max_gap']:.2e}")
    lines.append(f"replay lowers the mean gap by {result['gap_reduction']:.2e} ± {result['gap_reduction_se']:.1e} (paired s.e.); "
                 f"replayed routes identical to the sampler's: {result['replayed_identical']}")
    return "\n".join(lines)


def router_note(result: dict) -> str:
    """The caption printed under ``figure_router_mismatch``: what each panel draws, in words the labels leave out."""
    bug, fix = result["routing"]["recompute"], result["routing"]["replay"]
    differ = result["differ"]["recompute"]
    return (f"{result['experts']} experts, top-{result['top_k']}: the fp32 trainer against the bf16 sampler. Left: the share "
            "of tokens whose top-k expert set differs from the sampler's, per MoE layer and in at least one (a bar labelled "
            "0 is exactly 0; dotted: what independent layers would give). Middle: |log μ_sampler − log π_trainer| per "
            f"response token (log axes; mean {bug['mean_gap']:.1e} recomputed, {fix['mean_gap']:.1e} replayed). Right: the "
            f"trainer's router margin between its k-th and (k+1)-th expert at each (token, layer) route, routes recomputed: "
            f"{int(differ.sum())} on other experts than the sampler's, {int((~differ).sum())} on the same (margins below "
            "1e-7 drawn at 1e-7).")


def headline_sentence(result: dict) -> str:
    reproduced, fixed = verdict(result)
    bug, fix = result["routing"]["recompute"], result["routing"]["replay"]
    if not reproduced:
        return (f"{bug['router_disagreement']:.2%} of routes differ, the mean gap is {bug['mean_gap']:.1e} nats (threshold "
                f"{MIN_GAP:g}) and replay changes it by {result['gap_reduction']:.1e} ± {result['gap_reduction_se']:.1e}: "
                "no router mismatch shown on this sample")
    text = (f"recomputing its own routes, the fp32 trainer sends {bug['router_disagreement']:.1%} of (token, layer) routes to "
            f"another expert set than the bf16 sampler and {bug['any_layer']:.1%} of tokens in at least one of "
            f"{len(result['layers'])} layers (at that rate per layer, {result['deep_model_any_layer']:.0%} in a "
            f"{DEEP_MODEL_LAYERS}-layer model); the log-prob gap is {bug['mean_gap']:.2e} nats per token on average "
            f"(max {bug['max_gap']:.2e}). ")
    if fixed:
        return text + (f"Replaying the sampler's routes leaves 0 routes different and the gap at {fix['mean_gap']:.2e} "
                       f"(max {fix['max_gap']:.2e}): {bug['mean_gap'] / fix['mean_gap']:.1f}× smaller ({result['gap_reduction']:.1e} ± "
                       f"{result['gap_reduction_se']:.1e} per token); the rest is bf16 arithmetic (P12).")
    return text + (f"Replaying the sampler's routes left the gap at {fix['mean_gap']:.2e} with {fix['router_disagreement']:.2%} "
                   "of routes different: the replay did not force the recorded routes.")


# ---- explorer ------------------------------------------------------------------------------------
def router_explorer(result: dict) -> Explorer:
    """A layer and a routing: the router margins of that layer's routes, flipped ones coloured, redrawn."""

    def draw(layer, routing):
        fig, ax = plt.subplots(figsize=(6.5, 3.2))
        index = None if layer == "all" else int(layer)
        plot_margin(ax, result, index, routing)
        ax.legend(title=ROUTING_STYLES[routing][1], **plots.LEGEND_RIGHT)
        differ = result["differ"][routing] if index is None else result["differ"][routing][:, index]
        return {"layer": layer, "routing": routing, "disagreement": float(differ.float().mean())}

    layers = ["all", *map(str, range(len(result["layers"])))]
    return Explorer({"layer": widgets.Dropdown(options=layers, value="all", description="MoE layer"),
                     "routing": widgets.ToggleButtons(options=list(ROUTINGS)[::-1], value="recompute", description="trainer")},
                    draw, title="P30: where the trainer's routes leave the sampler's")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(result: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 30."""
    reproduced, fixed = verdict(result)
    plain = {k: v for k, v in result.items() if k not in ("differ", "margin", "log_ratio")}
    return dict(
        notebook="30_moe_router_mismatch", reproduced=reproduced, fixed=fixed, metrics={**plain, "min_gap": MIN_GAP, "z": Z},
        not_shown=not_shown(result),
        headline={"what": f"mean |log μ_sampler(bf16) − log π_trainer(fp32)| per response token; "
                          f"{result['routing']['recompute']['any_layer']:.0%} of tokens routed differently in ≥ 1 layer",
                  "unit": "nats per token", "bug": result["routing"]["recompute"]["mean_gap"],
                  "fix": result["routing"]["replay"]["mean_gap"]},
    )
