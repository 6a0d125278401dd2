"""Pitfall P37: the LoRA adapter never reaches the sampler — every weight sync pushes the frozen base.

With LoRA the trainer's policy is W + (α/r)·B·A: a frozen base W and a small trained adapter (A, B). A rollout engine
can receive it two ways: the merged weights W + (α/r)·B·A under the base names, or the base once and the adapter
tensors into its adapter slot. verl's disaggregated (fully async) sync did neither (issue #7495, PR #7496, 2026): it
called ``get_per_tensor_param()`` with ``base_sync_done=False`` on every sync, which for a LoRA model skips every
``lora_`` tensor and returns the frozen base renamed ``…base_layer.weight``; the engine accepted it, ``list_loras()``
stayed ``[]``, and the rollout sampled from the initial policy for the whole run. Nothing failed: the rollout–training
KL climbed with training, insensitive to the sync interval, and read like async staleness.

This module wraps a model's linear layers in a minimal LoRA (``LoRALinear``: ``base_layer``, ``lora_A``, ``lora_B``,
PEFT's names), builds the two payloads (``base_payload``: the bug; ``merged_payload``: the fix), and runs the
trainer/sampler loop of ``workbench.experiments.weight_sync`` for each payload at two sync intervals over seeds.
The signature: with the bug the sampler–trainer gap equals the trainer's drift from the initial policy and is the
same number at every sync interval (bit for bit: the sampler never changes, so nothing depends on the interval);
with the fix it is float noise at each sync and grows only between syncs.
"""

from __future__ import annotations

import copy

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from workbench.core import progress
from workbench.experiments import statistics
from workbench.experiments import weight_sync as ws
from workbench.viz import plots
from workbench.viz.explorer import Explorer

PAYLOADS = ("base", "merged")  # the bug, the fix
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "c_attn", "c_proj", "c_fc")


# ---- measurements --------------------------------------------------------------------------------
class LoRALinear(torch.nn.Module):
    """``base_layer(x) + (alpha / rank) · lora_B(lora_A(x))`` with the base frozen; B starts at 0, so the wrapped model
    is the base model until the adapter trains (PEFT's initialisation and parameter names)."""

    def __init__(self, base: torch.nn.Module, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.base_layer = base
        for p in base.parameters():
            p.requires_grad_(False)
        # GPT-2's Conv1D stores its weight as (in, out), nn.Linear as (out, in)
        self.transposed = is_conv1d(base)
        out_features, in_features = base.weight.shape[::-1] if self.transposed else base.weight.shape
        self.lora_A = torch.nn.Linear(in_features, rank, bias=False)
        self.lora_B = torch.nn.Linear(rank, out_features, bias=False)
        with torch.no_grad():
            self.lora_A.weight.copy_(torch.randn(rank, in_features, generator=generator) / in_features ** 0.5)
            self.lora_B.weight.zero_()
        self.scale = alpha / rank

    def forward(self, x):
        return self.base_layer(x) + self.scale * self.lora_B(self.lora_A(x))

    def merged_weight(self) -> torch.Tensor:
        delta = self.scale * self.lora_B.weight @ self.lora_A.weight
        return self.base_layer.weight + (delta.T if self.transposed else delta)


def is_conv1d(module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's projections: a linear layer whose weight is stored transposed)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def with_lora(model, *, rank: int = 8, alpha: float = 16.0, seed: int = 0):
    """``model`` (changed in place) with every attention and MLP ``nn.Linear`` wrapped in ``LoRALinear`` and every
    other parameter frozen: only the adapters train. Raises when the model has no such layer."""
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = 0
    for module in list(model.modules()):
        for name in TARGETS:
            child = getattr(module, name, None)
            if isinstance(child, torch.nn.Linear) or is_conv1d(child):
                setattr(module, name, LoRALinear(child, rank, alpha, generator))
                wrapped += 1
    if not wrapped:
        raise ValueError(f"with_lora: no nn.Linear or Conv1D named one of {TARGETS} in {type(model).__name__}; "
                         "LoRA targets the attention and MLP projections")
    return model


def base_payload(trainer) -> dict[str, torch.Tensor]:
    """The bug (verl ``collect_lora_params(base_sync_done=False)``): every ``lora_`` tensor skipped, the frozen base
    sent under the engine's names."""
    state = trainer.state_dict()
    return {name.replace(".base_layer", ""): tensor for name, tensor in state.items() if "lora_" not in name}


def merged_payload(trainer) -> dict[str, torch.Tensor]:
    """The fix: each wrapped layer's weight merged, W + (α/r)·B·A, under the base name; every other tensor as is."""
    payload = base_payload(trainer)
    for name, module in trainer.named_modules():
        if isinstance(module, LoRALinear):
            payload[f"{name}.weight"] = module.merged_weight()
    return payload


def push_for(payload: str):
    """``push(trainer, sampler)`` loading the ``payload`` (``"base"`` bug, ``"merged"`` fix) into the sampler by name."""
    if payload not in PAYLOADS:
        raise ValueError(f"payload={payload!r}; use one of {PAYLOADS} ('merged' is the fix)")
    build = base_payload if payload == "base" else merged_payload

    def push(trainer, sampler):
        missing, unexpected = sampler.load_state_dict(build(trainer), strict=False)
        if unexpected:
            raise KeyError(f"the sampler has no parameter named {unexpected[:3]}: the payload's names do not match")
    return push


def payload_summary(trainer, payload: str) -> dict:
    """What one sync sends: tensor count, how many are adapter tensors, and how far the sent weights are from the
    trainer's current policy (max |sent − merged| over the wrapped layers; 0 when the adapter is 0)."""
    sent = (base_payload if payload == "base" else merged_payload)(trainer)
    merged = merged_payload(trainer)
    return {"payload": payload, "tensors": len(sent), "lora_tensors": sum("lora_" in name for name in sent),
            "max_distance_to_policy": max(float((sent[k] - merged[k]).detach().abs().max()) for k in merged)}


# ---- sweeps --------------------------------------------------------------------------------------
def sync_runs(model, tokenizer, problems, *, intervals: list[int], seeds: list[int], steps: int, lr: float = 2e-3,
              batch_size: int = 8, rank: int = 8) -> dict:
    """``{(payload, interval): [history per seed]}``: a LoRA trainer and a sampler (a copy of ``model``) trained for
    ``steps`` with each payload pushed every ``interval`` updates (``weight_sync.sync_training``), plus what the last
    sync of seed 0 sent (``"payloads"``)."""
    runs, summaries = {}, {}
    configs = [(p, k, s) for p in PAYLOADS for k in intervals for s in seeds]
    for payload, interval, seed in progress.track(configs, "sync runs", unit="run"):
        trainer = with_lora(copy.deepcopy(model), rank=rank, seed=seed)
        sampler = copy.deepcopy(model)
        history = ws.sync_training(trainer, sampler, tokenizer, problems, steps=steps, sync_interval=interval,
                                   push=push_for(payload), batch_size=batch_size, lr=lr, seed=seed, initial=model)
        runs.setdefault((payload, interval), []).append(history)
        if seed == seeds[0] and interval == intervals[0]:
            summaries[payload] = payload_summary(trainer, payload)
    return {"runs": runs, "payloads": summaries, "intervals": list(intervals), "seeds": list(seeds), "steps": steps}


def labelled(result: dict, interval: int) -> dict[str, list[list[dict]]]:
    """``{"bug": …, "fix": …}`` histories at one sync interval (the shape ``experiments.statistics`` reads)."""
    return {"bug": result["runs"][("base", interval)], "fix": result["runs"][("merged", interval)]}


def gap_effects(result: dict) -> dict[int, statistics.Effect]:
    """Per interval, bug − fix of the gap over the last quarter of the steps, paired by seed."""
    return {k: statistics.effect(labelled(result, k), "gap", "bug", "fix") for k in result["intervals"]}


def interval_response(result: dict, payload: str) -> float:
    """Largest |gap at interval a − gap at interval b| over steps, seeds and interval pairs: 0 when the sync interval
    changes nothing (the bug), of the size of the gap itself when it does (the fix)."""
    first = np.array([[h["gap"] for h in run] for run in result["runs"][(payload, result["intervals"][0])]])
    return max(float(np.abs(first - np.array([[h["gap"] for h in run] for run in result["runs"][(payload, k)]])).max())
               for k in result["intervals"][1:])


def synced_gap(result: dict, payload: str) -> float:
    """Largest gap at the steps that sample right after a sync (step % interval == 0), over every run of ``payload``."""
    return max(h["gap"] for k in result["intervals"] for run in result["runs"][(payload, k)] for h in run
               if h["step"] % k == 0)


def drift_match(result: dict) -> float:
    """Largest |bug's gap − trainer's drift from the initial policy|: 0 up to float noise when the sampler is the
    initial policy."""
    return max(abs(h["gap"] - h["drift"]) for k in result["intervals"] for run in result["runs"][("base", k)] for h in run)


def headline_row(result: dict) -> dict:
    """The growth at the longest interval: the mean gap over the last quarter, bug and fix, with its s.e. over seeds."""
    interval = max(result["intervals"])
    e = gap_effects(result)[interval]
    return {"interval": interval, "bug": e.bug, "fix": e.fix, "effect": e.difference, "se": e.noise, "seeds": e.seeds,
            "first_gap": float(np.mean([run[0]["gap"] for run in result["runs"][("base", interval)]])),
            "bug_se": tail_se(result["runs"][("base", interval)])}


def tail_se(histories: list[list[dict]]) -> float:
    """The s.e. over seeds of the gap's last-quarter mean (NaN with one seed)."""
    values = [statistics.tail_mean(run, "gap") for run in histories]
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else float("nan")


# ---- verdict -------------------------------------------------------------------------------------
PREDICTION = statistics.Prediction("gap", "sampler–trainer log-prob gap over the last quarter of the steps", "+", "nats/token")


def verdict(result: dict, *, gap_threshold: float = 1e-2, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed).

    Reproduced: the base payload carries no adapter tensor, its gap over the last quarter exceeds ``gap_threshold``
    nats/token at every interval, and it is identical at every sync interval (``interval_response`` ≤ 1e-9).
    Fixed: the merged payload leaves a gap ≤ ``tolerance`` at every step that samples right after a sync, and its gap
    moves with the sync interval (``interval_response`` > ``tolerance``) or the only interval is 1.
    """
    effects = gap_effects(result)
    reproduced = (result["payloads"]["base"]["lora_tensors"] == 0 and all(e.bug > gap_threshold for e in effects.values())
                  and interval_response(result, "base") <= 1e-9)
    responds = len(result["intervals"]) < 2 or interval_response(result, "merged") > tolerance
    fixed = synced_gap(result, "merged") <= tolerance and responds
    return reproduced, fixed


def not_shown(result: dict, *, gap_threshold: float = 1e-2) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: when the adapter barely moved the trainer (the bug's tail
    gap ≤ ``gap_threshold``), a sampler pinned at the initial policy is indistinguishable from a synced one."""
    head = headline_row(result)
    if head["bug"] > gap_threshold:
        return None
    frozen = ws.no_update_reason(list(result["runs"].values()))
    if frozen:
        return frozen
    return (f"the LoRA adapter moved this checkpoint's policy by only {head['bug']:.1e} nats/token in {result['steps']} steps "
            f"(threshold {gap_threshold:g}): a sampler left at the initial policy is not yet distinguishable; raise the "
            "learning rate or the steps")


# ---- figures -------------------------------------------------------------------------------------
def gap_runs(result: dict) -> tuple[dict, dict, dict]:
    """Every (payload, interval) as a labelled run for ``plots.plot_bands``, with its colour and line style."""
    runs, colors, styles = {}, {}, {}
    for payload, tag in zip(PAYLOADS, ("bug", "fix"), strict=True):
        for i, k in enumerate(result["intervals"]):
            label = f"{tag}: {'base only' if payload == 'base' else 'merged'}, sync every {k}"
            runs[label] = result["runs"][(payload, k)]
            colors[label] = plots.BUG_COLOR if tag == "bug" else plots.FIX_COLOR
            styles[label] = {"ls": plots.LINE_STYLES[i % 4], "marker": plots.MARKERS[i % 6]}
    return runs, colors, styles


def plot_gap(ax, result: dict) -> None:
    """Mean |log μ − log π_θ| per token over training steps, each payload at each interval, ± std over seeds."""
    runs, colors, styles = gap_runs(result)
    plots.plot_bands(ax, runs, "gap", "gap, nats/token", colors, styles=styles)
    ax.set_title("sampler vs trainer", fontsize=10)


def plot_drift(ax, result: dict) -> None:
    """The bug's gap against the trainer's drift from the initial policy, per step (seed means): on the diagonal."""
    k = result["intervals"][-1]
    gap = np.mean([[h["gap"] for h in run] for run in result["runs"][("base", k)]], axis=0)
    drift = np.mean([[h["drift"] for h in run] for run in result["runs"][("base", k)]], axis=0)
    top = float(max(gap.max(), drift.max(), 1e-3)) * 1.05
    ax.plot([0, top], [0, top], color=plots.NEUTRAL_COLOR, ls=":", label="gap = drift")
    ax.plot(drift, gap, "o", color=plots.BUG_COLOR, label=f"bug, sync every {k}")
    ax.set_xlabel("|log π_θ − log π_0|, trainer's drift")
    ax.set_ylabel("bug's gap, nats/token")
    ax.set_title("the bug's gap is the drift", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")


def figure_lora_sync(result: dict):
    """The notebook's figure: the gap over steps (left), the bug's gap against the drift from π_0 (right)."""
    fig, axes = plots.panel_grid(2, panel_height=3.4)
    plot_gap(axes[0], result)
    plot_drift(axes[1], result)
    plots.figure_legend(fig, axes[0], ncol=2)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def payload_lines(result: dict) -> str:
    return "\n".join(f"{'bug' if s['payload'] == 'base' else 'fix'} ({s['payload']} payload): {s['tensors']} tensors, "
                     f"{s['lora_tensors']} of them lora_; max |sent − current policy| {s['max_distance_to_policy']:.3g}"
                     for s in result["payloads"].values())


def growth_lines(result: dict) -> str:
    """Per interval: the gap at step 0 and over the last quarter, bug and fix, effect ± s.e. over the seeds."""
    lines = []
    for k, e in gap_effects(result).items():
        start = np.mean([run[0]["gap"] for run in result["runs"][("base", k)]])
        lines.append(f"sync every {k}: gap at step 0 {start:.2g}; last quarter bug {e.bug:.3f}, fix {e.fix:.3f} nats/token; "
                     f"bug − fix {e.difference:+.3f} ± {e.noise:.2g} (s.e., seeds {result['seeds']}; MDE {e.mde:.2g})")
    return "\n".join(lines)


def lora_note(result: dict) -> str:
    """The caption printed under ``figure_lora_sync``."""
    a, b = result["intervals"][0], result["intervals"][-1]
    return (f"Left: mean |log μ − log π_θ| per sampled token, μ the sampler's log-probs, π_θ the LoRA trainer's, before each "
            f"step's update; bug (vermilion): every sync pushes the frozen base; fix (blue): the merged W + (α/r)·B·A; "
            f"solid: sync every {a} update(s), dashed: every {b}. The bug's two lines lie on each other (ringed). Right: per "
            f"step, the bug's gap against the trainer's mean |log π_θ − log π_0| on the same tokens; dotted: equality.")


def headline_sentence(result: dict) -> str:
    """The bug's growth with its s.e., its response to the interval, and the fix's gap after each sync."""
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    same = interval_response(result, "base")
    if not reproduced:
        return f"not reproduced: last-quarter gap {head['bug']:.3g} nats/token, interval response {same:.2g} (see not_shown)"
    return (f"the bug's gap grew from {head['first_gap']:.1g} to {head['bug']:.3f} ± {head['bug_se']:.2g} nats/token "
            f"(last quarter, seeds {result['seeds']}) and is "
            + ("identical, bit for bit," if same == 0 else f"the same to {same:.1e}") + " at every sync interval; the fix's "
            f"gap is ≤ {synced_gap(result, 'merged'):.1e} right after each sync" + (" (fixed)." if fixed else " — not fixed."))


# ---- explorer ------------------------------------------------------------------------------------
def sync_explorer(result: dict) -> Explorer:
    """Pick the sync interval and the measure (gap, KL estimate, drift): bug and fix over steps, redrawn."""

    def draw(interval, measure):
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        runs = {f"bug, every {interval}": result["runs"][("base", interval)],
                f"fix, every {interval}": result["runs"][("merged", interval)]}
        plots.plot_bands(ax, runs, measure, f"{measure}, nats/token", plots.bug_fix_colors(list(runs)))
        tail = {label: float(np.mean([statistics.tail_mean(run, measure) for run in hs])) for label, hs in runs.items()}
        ax.set_title(f"sync every {interval}: last quarter bug {tail[next(iter(runs))]:.3f}", fontsize=9)
        return {"interval": interval, "measure": measure, "bug_tail": tail[next(iter(runs))]}

    return Explorer({"interval": widgets.Dropdown(options=result["intervals"], value=result["intervals"][-1],
                                                  description="sync every"),
                     "measure": widgets.Dropdown(options=["gap", "kl", "drift"], value="gap", description="measure")},
                    draw, title="P37: the sampler's weights with a LoRA trainer")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(result: dict, task: str = "arith") -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 37."""
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    effects = gap_effects(result)
    return dict(
        notebook="37_lora_sync", reproduced=reproduced, fixed=fixed, not_shown=not_shown(result),
        metrics={"payloads": result["payloads"], "seeds": result["seeds"], "steps": result["steps"],
                 "interval_response": {p: interval_response(result, p) for p in PAYLOADS},
                 "synced_gap_fix": synced_gap(result, "merged"), "drift_match_bug": drift_match(result),
                 "gap_effects": {str(k): vars(e) for k, e in effects.items()},
                 "prediction": PREDICTION.record({"gap": effects[head["interval"]]}, task),
                 "gap_by_step": {f"{p}_{k}": np.mean([[h["gap"] for h in run] for run in runs], axis=0).tolist()
                                 for (p, k), runs in result["runs"].items()}},
        headline={"what": f"sampler–trainer log-prob gap over the last quarter of {result['steps']} steps, sync every "
                          f"{head['interval']} (seeds {result['seeds']})", "unit": "nats/token",
                  "bug": head["bug"], "fix": head["fix"]},
    )
