"""Pitfall P48: FP8 rollout weights whose quantisation ignore-list misses the MoE router.

Frameworks that sample with FP8 weights (verl's FP8 rollout, slime, NeMo-RL, prime-rl) quantise every linear weight of
the rollout copy except an ignore-list: the embeddings, the LM head and the mixture-of-experts router. The list matches
module *names*, and router names differ between architectures and library versions (``block_sparse_moe.gate`` for
Mixtral in transformers 4, ``mlp.gate`` in transformers 5 and Qwen-MoE/DeepSeek, ``router``, ``mixer.gate``…). NeMo-RL
PR #3614 (August 2026) found its skip-list (``"router"``, ``"mlp.gate."``) quantising most routers; prime-rl PR #2910's
review (July 2026) caught a change that dropped the default ignore patterns; prime-rl PR #2442 (May 2026) the opposite
error, a regex ``mlp.gate.`` that also skipped ``gate_proj``. A router is a top-k argmax: FP8 error on its weights flips
expert choices, so the sampler's policy is no longer the trainer's far beyond the dense layers' quantisation gap.

Here the FP8 round trip is simulated on the sampler's copy with ``torch.float8_e4m3fn`` (scale = amax / 448 per tensor,
or per output channel): every weight of two or more dimensions is quantised unless a pattern of the ignore-list is in
its name. The same sequences (drawn from the fp32 trainer) are scored by the fp32 trainer and by FP8 copies built with
an ignore-list that holds this checkpoint's router name (the fix) and one written for another naming (the bug).
Measured: |log μ − log π| per response token, the share of (token, layer) whose top-k expert set differs from the
trainer's, and the entropy of the expert load per layer.
"""

from __future__ import annotations

import copy
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.experiments.comparison import one_thread_if_tiny
from workbench.modeling.rollout import sample
from workbench.modeling.routing_replay import RoutingHooks, is_topk_router, route_disagreement
from workbench.modeling.scoring import token_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
IGNORE_LISTS = {  # the fix names this checkpoint's router (transformers 5: mlp.gate); the bug, Mixtral's transformers-4 name
    "router kept": ("embed_tokens", "lm_head", "mlp.gate.", "block_sparse_moe.gate.", "router"),
    "router missed": ("embed_tokens", "lm_head", "block_sparse_moe.gate."),
}
VARIANTS = (*IGNORE_LISTS, "router alone")  # "router alone": only the router weights quantised, the control
VARIANT_COLORS = {"router kept": plots.FIX_COLOR, "router missed": plots.BUG_COLOR, "router alone": plots.SERIES_COLORS[0]}
MIN_GAP = 1e-3  # nats per token: the router alone must move the log-probs by at least this
Z = 2.0  # standard errors by which the bug's gap must exceed the fix's
EXPLORER_PANELS = {"load entropy": "entropy", "log-prob gap": "gaps", "route flips": "disagreement"}


# ---- measurements --------------------------------------------------------------------------------
def fp8_roundtrip(weight: torch.Tensor, granularity: str = "tensor") -> torch.Tensor:
    """``weight`` quantised to float8_e4m3fn and back: scale = amax / 448 over the whole tensor (``"tensor"``) or over
    each output row, the last dimension (``"channel"``)."""
    if granularity not in ("tensor", "channel"):
        raise ValueError(f"granularity must be 'tensor' or 'channel', got {granularity!r}")
    w = weight.float()
    amax = w.abs().amax() if granularity == "tensor" else w.abs().amax(-1, keepdim=True)
    scale = (amax / E4M3_MAX).clamp(min=1e-12)
    return ((w / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)


def fp8_copy(model, ignore: tuple[str, ...], granularity: str = "tensor", *, routers_only: bool = False):
    """A copy of ``model`` with every ≥ 2-D parameter FP8-round-tripped unless one of ``ignore`` is in its name (with
    ``routers_only``, only the routers' weights); also the names of the router weights it quantised."""
    moved = copy.deepcopy(model)
    routers = {name for name, m in model.named_modules() if is_topk_router(m)}
    quantised_routers = []
    with torch.no_grad():
        for name, p in moved.named_parameters():
            is_router = name.rsplit(".", 1)[0] in routers
            if p.ndim >= 2 and not any(pattern in name for pattern in ignore) and (is_router or not routers_only):
                p.copy_(fp8_roundtrip(p, granularity))
                if is_router:
                    quantised_routers.append(name)
    return moved, quantised_routers


def load_entropy(routes: dict[str, torch.Tensor], experts: int) -> list[float]:
    """Per layer, the entropy of the expert load (share of routed token slots per expert) over log(experts): 1 = every
    expert equally loaded, 0 = one expert takes all."""
    out = []
    for index in routes.values():
        load = torch.bincount(index.reshape(-1).cpu(), minlength=experts).float()
        p = load / load.sum()
        out.append(float(-(p[p > 0] * p[p > 0].log()).sum() / math.log(experts)))
    return out


@torch.no_grad()
def fp8_gaps(model, tokenizer, ids: torch.Tensor, mask: torch.Tensor, *, granularities=("tensor", "channel"),
             max_new_tokens: int = 8, seed: int = 0) -> dict:
    """Sequences sampled by the fp32 ``model`` scored by it and by FP8 copies per (ignore-list, granularity):
    ``{"moe": bool, (variant, granularity): {mean_gap, gap_se, max_gap, gaps, router_disagreement, any_layer,
    load_entropy, quantised_routers}, "trainer": {load_entropy}}``."""
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    seq = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    seq_mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
    response = torch.zeros_like(seq_mask[:, 1:])
    response[:, rollout.prompt_ids.shape[1] - 1:] = rollout.response_mask
    response = response.bool()
    moe = any(is_topk_router(m) for m in model.modules())
    experts = next((m.num_experts for m in model.modules() if is_topk_router(m)), 0)
    if moe:
        with RoutingHooks(model, "record") as trainer_routes:
            trainer_logp = token_logprobs(model, seq, seq_mask)
    else:
        trainer_logp = token_logprobs(model, seq, seq_mask)
    out: dict = {"moe": moe, "experts": experts, "response_tokens": int(response.sum()),
                 "trainer": {"load_entropy": load_entropy(_kept(trainer_routes.routes, seq_mask), experts) if moe else []}}
    for variant in VARIANTS:
        for granularity in granularities:
            copy_, quantised = fp8_copy(model, IGNORE_LISTS.get(variant, ()), granularity, routers_only=variant == "router alone")
            row: dict = {"quantised_routers": quantised}
            if moe:
                with RoutingHooks(copy_, "record") as sampler_routes:
                    logp = token_logprobs(copy_, seq, seq_mask)
                differ = route_disagreement(trainer_routes.routes, sampler_routes.routes, seq_mask).float()
                row.update(router_disagreement=float(differ.mean()), any_layer=float(differ.amax(-1).mean()),
                           load_entropy=load_entropy(_kept(sampler_routes.routes, seq_mask), experts))
            else:
                logp = token_logprobs(copy_, seq, seq_mask)
                row.update(router_disagreement=0.0, any_layer=0.0, load_entropy=[])
            gaps = (logp - trainer_logp)[response].abs()
            row.update(mean_gap=float(gaps.mean()), gap_se=float(gaps.std() / math.sqrt(gaps.numel())), max_gap=float(gaps.max()),
                       gaps=gaps)
            out[variant, granularity] = row
    return out


def _kept(routes: dict[str, torch.Tensor], seq_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The routes of real (unpadded) tokens only."""
    keep = seq_mask.reshape(-1).bool()
    return {name: index[keep.to(index.device)] for name, index in routes.items()}


# ---- sweeps --------------------------------------------------------------------------------------
def measure(model, tokenizer, ids, mask, *, granularities, max_new_tokens: int = 8, seed: int = 0) -> dict:
    """``fp8_gaps`` on one torch thread when the model is tiny and on the CPU (a second thread only spins on operations
    this small); the caller's setting is restored."""
    with one_thread_if_tiny(model):
        return fp8_gaps(model, tokenizer, ids, mask, granularities=tuple(granularities), max_new_tokens=max_new_tokens, seed=seed)


def headline(result: dict, granularity: str = "tensor") -> dict:
    """Bug vs fix at ``granularity``: the mean gap and route disagreement of each, the paired gap difference per token
    (mean ± s.e.), and the lowest per-layer load entropy of each copy and of the trainer."""
    bug, fix, alone = (result[v, granularity] for v in ("router missed", "router kept", "router alone"))
    diff = bug["gaps"] - fix["gaps"]
    return {"granularity": granularity, "moe": result["moe"], "bug_gap": bug["mean_gap"], "fix_gap": fix["mean_gap"],
            "alone_gap": alone["mean_gap"], "alone_disagreement": alone["router_disagreement"],
            "alone_any_layer": alone["any_layer"],
            "gap_difference": float(diff.mean()), "gap_difference_se": float(diff.std() / math.sqrt(diff.numel())),
            "bug_disagreement": bug["router_disagreement"], "fix_disagreement": fix["router_disagreement"],
            "bug_any_layer": bug["any_layer"], "fix_any_layer": fix["any_layer"],
            "quantised_routers_bug": len(bug["quantised_routers"]), "quantised_routers_fix": len(fix["quantised_routers"]),
            "min_entropy": {k: min(v) if v else float("nan") for k, v in (("trainer", result["trainer"]["load_entropy"]),
                                                                         ("bug", bug["load_entropy"]), ("fix", fix["load_entropy"]))}}


# ---- verdict -------------------------------------------------------------------------------------
def not_shown(result: dict) -> str | None:
    """Why this checkpoint cannot show P48 (a dense model has no router), or None."""
    if not result["moe"]:
        return ("a dense model has no mixture-of-experts router: both ignore-lists quantise the same weights, so only the "
                "dense FP8 gap is measured; use an MoE checkpoint (the built-in tiny-mixtral)")
    return None


def verdict(head: dict) -> tuple[bool, bool]:
    """(reproduced, fixed). Reproduced: the ignore-list that misses the router quantises router weights; the routers
    alone quantised (the control) flip routes and move the log-probs by more than ``MIN_GAP``; and with the whole copy
    quantised, missing the router flips more routes and widens the mean gap (its paired difference and standard error
    are reported by ``gap_significance``, not required: upstream layers already flip many of the same routes). Fixed:
    the fixed list quantises no router weight (the routes that still differ come from the quantised layers upstream:
    routing replay, notebook 30, removes those). A dense model: (False, True)."""
    if not head["moe"]:
        return False, True
    reproduced = (head["quantised_routers_bug"] > 0 and head["alone_disagreement"] > 0 and head["alone_gap"] > MIN_GAP
                  and head["bug_disagreement"] > head["fix_disagreement"] and head["bug_gap"] > head["fix_gap"])
    fixed = head["quantised_routers_fix"] == 0
    return bool(reproduced), bool(fixed)


def gap_significance(head: dict, *, z: float = Z) -> bool:
    """Whether missing the router widens the per-token gap of the fully quantised copy by more than ``z`` standard
    errors of the paired difference."""
    return bool(head["gap_difference"] > z * head["gap_difference_se"])


# ---- figures -------------------------------------------------------------------------------------
def plot_gaps(ax, result: dict, granularities) -> None:
    """Mean |log μ − log π| per response token (± 2 s.e.) per granularity, router kept vs missed."""
    width = 0.27
    for k, variant in enumerate(VARIANTS):
        rows = [result[variant, g] for g in granularities]
        ax.bar([i + (k - 1) * width for i in range(len(rows))], [r["mean_gap"] for r in rows], width,
               yerr=[2 * r["gap_se"] for r in rows], color=VARIANT_COLORS[variant], label=variant)
    ax.set_xticks(range(len(granularities)), [f"per {g}" for g in granularities])
    ax.set_ylabel("mean |Δ log p|, nats")
    ax.legend(**plots.legend_outside(ax))


def plot_disagreement(ax, result: dict, granularities) -> None:
    """Share of (token, layer) whose top-k expert set differs from the trainer's, per granularity."""
    width = 0.27
    for k, variant in enumerate(VARIANTS):
        bars = ax.bar([i + (k - 1) * width for i in range(len(granularities))],
                      [result[variant, g]["router_disagreement"] for g in granularities], width, color=VARIANT_COLORS[variant],
                      label=variant)
        plots.label_zero_bars(ax, bars)
    ax.set_xticks(range(len(granularities)), [f"per {g}" for g in granularities])
    ax.set_ylabel("routes differing from fp32")
    ax.legend(**plots.legend_outside(ax))


def plot_entropy(ax, result: dict, granularity: str) -> None:
    """Expert-load entropy per MoE layer: the fp32 trainer and both FP8 copies."""
    layers = range(len(result["trainer"]["load_entropy"]))
    ax.plot(layers, result["trainer"]["load_entropy"], ":", color=plots.NEUTRAL_COLOR, lw=3, label="fp32 trainer")
    for variant, style in zip(VARIANTS, ("s--", "o-", "^:"), strict=True):
        ax.plot(layers, result[variant, granularity]["load_entropy"], style, color=VARIANT_COLORS[variant], label=f"FP8, {variant}")
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("load entropy / log(experts)")
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def figure_fp8_router(result: dict, granularities, granularity: str):
    panels = 3 if result["moe"] else 1
    fig, axes = plots.panel_grid(panels, columns=2 if panels == 3 else 1, panel_height=3.6, width=9.6 if panels == 3 else 6.0)
    plot_gaps(axes[0], result, granularities)
    if result["moe"]:
        plot_disagreement(axes[1], result, granularities)
        plot_entropy(axes[2], result, granularity)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def variant_lines(result: dict, granularities) -> str:
    lines = []
    for variant in VARIANTS:
        for g in granularities:
            r = result[variant, g]
            lines.append(f"{variant:13} per {g:7}: mean |Δ log p| {r['mean_gap']:.4f} ± {r['gap_se']:.4f} (max {r['max_gap']:.3f}); "
                         f"routes differing {r['router_disagreement']:.1%} (≥ 1 layer: {r['any_layer']:.1%}); "
                         f"router weights quantised: {len(r['quantised_routers'])}")
    return "\n".join(lines)


def routers_line(result: dict, granularity: str) -> str:
    """The router weights the buggy ignore-list quantised, by name (the evidence to look for in a conversion log)."""
    names = result["router missed", granularity]["quantised_routers"]
    return (f"quantised by the list {IGNORE_LISTS['router missed']}: " + ", ".join(names)) if names else "no router weight was quantised"


def headline_sentence(head: dict) -> str:
    reproduced, fixed = verdict(head)
    if not head["moe"]:
        return f"dense model: the FP8 gap is {head['fix_gap']:.4f} nats per token with either list; nothing router-specific to show."
    e = head["min_entropy"]
    return (f"Per {head['granularity']}: with the router quantised the mean gap is {head['bug_gap']:.4f} nats per token against "
            f"{head['fix_gap']:.4f} with it kept (+{head['gap_difference']:.4f} ± {head['gap_difference_se']:.4f}, paired); "
            f"{head['bug_disagreement']:.1%} of routes flip against {head['fix_disagreement']:.1%}; lowest load entropy "
            f"{e['bug']:.3f} (router quantised) vs {e['fix']:.3f} (kept) and {e['trainer']:.3f} (fp32). The router alone "
            f"quantised flips {head['alone_disagreement']:.1%} of routes ({head['alone_any_layer']:.1%} of tokens in ≥ 1 layer) "
            f"and moves log-probs by {head['alone_gap']:.4f} nats per token. The widening is "
            + ("" if gap_significance(head) else "not ") + f"beyond {Z:g} standard errors. "
            + ("Reproduced" if reproduced else "Not reproduced") + ("; the fixed list keeps every router weight." if fixed else "."))


def fp8_note(n_prompts: int, max_new_tokens: int) -> str:
    return (f"{n_prompts} prompts, up to {max_new_tokens} tokens sampled by the fp32 model, scored by it and by FP8 (e4m3) "
            "copies (router kept / missed by the ignore-list; router alone quantised: the control); error bars ± 2 s.e. "
            "over response tokens. Left: log-prob gap. Right: share of (token, layer) whose "
            "top-k expert set differs from fp32. Bottom: entropy of the expert load per layer (1 = uniform).")


# ---- explorer ------------------------------------------------------------------------------------
def fp8_explorer(result: dict, granularities) -> Explorer:
    """A choice of panel (expert-load entropy per layer, log-prob gap, route flips) and of granularity, redrawn for the
    trainer and the FP8 copies (a dense model has only the log-prob gap)."""

    def draw(panel, granularity):
        fig, ax = plt.subplots(figsize=(6, 3.8))
        if panel == "entropy" and result["moe"]:
            plot_entropy(ax, result, granularity)
        elif panel == "disagreement" and result["moe"]:
            plot_disagreement(ax, result, (granularity,))
        else:
            plot_gaps(ax, result, (granularity,))
        fig.tight_layout()
        return {"panel": panel, **headline(result, granularity)}

    controls = {"panel": widgets.Dropdown(options=list(EXPLORER_PANELS.items()), value="entropy", description="show"),
                "granularity": widgets.Dropdown(options=list(granularities), value=granularities[0], description="scale")}
    return Explorer(controls, draw, title="P48: FP8 copies with and without the router quantised")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(result: dict, head: dict, granularities, settings: dict) -> dict:
    reproduced, fixed = verdict(head)
    rows = {f"{v} / {g}": {k: val for k, val in result[v, g].items() if k != "gaps"} for v in VARIANTS for g in granularities}
    return dict(
        notebook="48_fp8_router_quantised", reproduced=reproduced, fixed=fixed,
        metrics={"by_variant": rows, "trainer_load_entropy": result["trainer"]["load_entropy"], "headline": head,
                 "not_shown": not_shown(result), "settings": settings},
        headline={"what": f"mean |Δ log p| per response token, FP8 per {head['granularity']} vs fp32", "unit": "nats",
                  "bug": head["bug_gap"], "fix": head["fix_gap"]},
    )
