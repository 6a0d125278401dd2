"""Pitfall P47: the rollout engine returns log-probs before temperature — the sampler-side twin of P6.

vLLM's ``logprobs_mode`` defaults to ``raw_logprobs``: the log-probs of the model's logits *before* temperature (and
top-k/top-p), not of the distribution the token was drawn from. A trainer that recomputes its log-probs correctly at τ
(P6 fixed) and takes π_old or the importance-sampling denominator from the engine then has ρ ≠ 1 before any update:
TRL issue #4159 (September 2025) printed a first-token IS ratio of 2.0 (the TIS cap) at τ = 0.6 in colocate mode; PR #4163
made TRL start vLLM (≥ 0.10.2) with ``logprobs_mode="processed_logprobs"`` (server mode: ``--logprobs-mode
processed_logprobs``). prime-rl divided the returned log-probs by τ before PR #697 (August 2025) — wrong too: log
softmax(z)/τ is not log softmax(z/τ) — and moved to processed log-probs.

Measured here twice on the same prompts: in the workbench's own sampler (``sample(..., logprobs_mode="raw")``, the bug,
vs ``"processed"``, its default) and, where vLLM's CPU build is installed (``make engines``, notebook 94), in vLLM itself
with ``raw_logprobs`` vs ``processed_logprobs``. The trainer is always right (log softmax(z/τ) of the same weights), so
every gap is the sampler's.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.engines import envs
from workbench.experiments.comparison import one_thread_if_tiny
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.viz import plots
from workbench.viz.explorer import Explorer

MODES = {"raw": "raw log-probs (bug)", "raw/τ": "raw ÷ τ (prime-rl < #697)", "processed": "processed (fix)"}
MODE_COLORS = {"raw": plots.BUG_COLOR, "raw/τ": plots.SERIES_COLORS[0], "processed": plots.FIX_COLOR}
ENGINE_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
MATCH = 1e-4  # nats: an fp32 sampler and the fp32 training forward agree to this (the fix)
GAP = 1e-2  # max |ρ − 1| a bug must exceed


# ---- measurements --------------------------------------------------------------------------------
def ratio_stats(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, tis_cap: float) -> dict:
    """ρ = exp(log π_trainer − log π_sampler) over the response tokens: max |ρ − 1|, mean |log ρ|, the first token's
    mean ρ (what TRL #4159 printed), the share of tokens above the TIS cap, and the mean truncated weight min(ρ, cap)."""
    keep = mask.bool()
    log_ratio = trainer_logp - sampler_logp
    rho = log_ratio.exp()
    first = rho[:, 0][keep[:, 0]]
    return {"max_ratio_deviation": float((rho - 1).abs()[keep].max()), "mean_abs_log_ratio": float(log_ratio.abs()[keep].mean()),
            "first_token_ratio": float(first.mean()), "above_cap": float((rho[keep] > tis_cap).float().mean()),
            "tis_weight": float(rho[keep].clamp(max=tis_cap).mean())}


@torch.no_grad()
def sampler_case(model, tokenizer, ids: torch.Tensor, mask: torch.Tensor, *, temperature: float, tis_cap: float = 2.0,
                 seed: int = 0, max_new_tokens: int = 8) -> dict:
    """The workbench sampler at ``temperature`` with ``logprobs_mode`` raw and processed (the same seed: the same
    tokens), and raw ÷ τ; each against the trainer's log-probs at τ. ``{mode: ratio_stats}``."""
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    rollouts = {m: sample(model, ids, mask, logprobs_mode=m, generator=torch.Generator().manual_seed(seed), **kw)
                for m in ("raw", "processed")}
    if not torch.equal(rollouts["raw"].response_ids, rollouts["processed"].response_ids):
        raise RuntimeError("the raw and processed samples drew different tokens for one seed: the log-prob mode must "
                           "not change the draw")
    r = rollouts["processed"]
    trainer = response_logprobs(model, ids, mask, r.response_ids, r.response_mask, temperature=temperature)
    sampled = {"raw": rollouts["raw"].rollout_logprobs, "raw/τ": rollouts["raw"].rollout_logprobs / temperature,
               "processed": r.rollout_logprobs}
    return {m: ratio_stats(trainer, sampled[m], r.response_mask, tis_cap) for m in MODES}


def engine_case(model, tokenizer, ids: torch.Tensor, mask: torch.Tensor, *, model_name: str, temperature: float,
                tis_cap: float = 2.0, seed: int = 0, max_new_tokens: int = 8) -> dict:
    """vLLM's CPU build with ``raw_logprobs`` and ``processed_logprobs`` (one engine each, ~30 s apiece on 2 cores),
    against the trainer at τ: ``{"ran": True, "raw": ratio_stats, "processed": ratio_stats, "engine": {...}}``, or
    ``{"ran": False, "reason": ...}`` without the engine environment or for a model the engine cannot serve."""
    from workbench.core.errors import EngineError
    from workbench.engines.checks import check_head_dim
    from workbench.engines.sampler import EngineOptions, EngineSampler

    status = envs.locate()
    if not status.ready:
        return {"ran": False, "reason": f"not run: the vLLM CPU engine is not installed (`make engines`; {status.reason})"}
    try:
        check_head_dim(model.config)
    except (EngineError, ValueError) as exc:
        return {"ran": False, "reason": f"not run: {exc}"}
    out: dict = {"ran": True, "reason": "", "temperature": temperature}
    for mode, engine_mode in ENGINE_MODES.items():
        with EngineSampler(EngineOptions(precision="fp32", logprobs_mode=engine_mode), name=model_name) as engine:
            engine.start(model)
            out["engine"] = {k: engine.info.get(k) for k in ("vllm", "dtype")}
            r = engine.sample(ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, temperature=temperature, seed=seed)
        with torch.no_grad():
            trainer = response_logprobs(model, ids, mask, r.response_ids, r.response_mask, temperature=temperature)
        out[mode] = ratio_stats(trainer, r.rollout_logprobs, r.response_mask, tis_cap)
    return out


# ---- sweeps --------------------------------------------------------------------------------------
def sweep(model, tokenizer, ids, mask, temperatures, *, tis_cap: float = 2.0, seed: int = 0) -> dict:
    """``sampler_case`` at every temperature: ``{τ: {mode: ratio_stats}}``. A tiny model on the CPU runs on one torch
    thread (a second only spins on operations this small: 0.24 against 8.8 CPU-seconds measured on a shared machine)."""
    with one_thread_if_tiny(model):
        return {t: sampler_case(model, tokenizer, ids, mask, temperature=t, tis_cap=tis_cap, seed=seed) for t in temperatures}


def headline_temperature(results: dict, preferred: float) -> float:
    """``preferred`` if swept, else the swept τ ≠ 1 with the largest raw-mode gap."""
    if preferred in results:
        return preferred
    return max((t for t in results if t != 1.0), key=lambda t: results[t]["raw"]["max_ratio_deviation"], default=1.0)


# ---- verdict -------------------------------------------------------------------------------------
def verdict(results: dict, engine: dict | None = None) -> tuple[bool, bool]:
    """(reproduced, fixed). Reproduced: at some τ ≠ 1 raw log-probs (and raw ÷ τ) leave max |ρ − 1| > ``GAP`` in the
    workbench sampler, and in vLLM when it ran. Fixed: processed log-probs keep max |ρ − 1| ≤ ``MATCH`` at every τ
    (and in vLLM when it ran)."""
    others = [t for t in results if t != 1.0]
    reproduced = any(results[t]["raw"]["max_ratio_deviation"] > GAP and results[t]["raw/τ"]["max_ratio_deviation"] > GAP
                     for t in others)
    fixed = all(r["processed"]["max_ratio_deviation"] <= MATCH for r in results.values())
    if engine and engine.get("ran"):
        reproduced = reproduced and engine["raw"]["max_ratio_deviation"] > GAP
        fixed = fixed and engine["processed"]["max_ratio_deviation"] <= MATCH
    return bool(reproduced), bool(fixed)


# ---- figures -------------------------------------------------------------------------------------
def plot_ratio_vs_temperature(ax, results: dict) -> None:
    """max |ρ − 1| before any update vs τ, per log-prob mode (log axis; exact zeros listed in the title)."""
    temperatures = sorted(results)
    zeros = []
    for mode, label in MODES.items():
        values = [results[t][mode]["max_ratio_deviation"] for t in temperatures]
        zeros += [f"{mode} τ={t}" for t, v in zip(temperatures, values, strict=True) if v == 0]
        ax.plot(temperatures, [v if v > 0 else float("nan") for v in values], "s--" if mode == "processed" else "o-",
                color=MODE_COLORS[mode], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("sampling temperature τ")
    ax.set_ylabel("max |ρ − 1| at step 0")
    if zeros:
        ax.set_title("exactly 0 (not drawn): " + ", ".join(zeros), fontsize=8)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_first_token(ax, results: dict, tis_cap: float) -> None:
    """The first response token's mean truncated IS weight min(ρ, cap) vs τ, per mode (TRL #4159's print), and the cap."""
    temperatures = sorted(results)
    for mode, label in MODES.items():
        ax.plot(temperatures, [results[t][mode]["tis_weight"] for t in temperatures],
                "s--" if mode == "processed" else "o-", color=MODE_COLORS[mode], label=label)
    ax.axhline(1.0, color=plots.NEUTRAL_COLOR, lw=0.8, ls=":")
    ax.set_xlabel("sampling temperature τ")
    ax.set_ylabel(f"mean min(ρ, {tis_cap:g}), all tokens")
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_side_by_side(ax, results: dict, engine: dict, temperature: float) -> None:
    """At ``temperature``: max |ρ − 1| of raw and processed log-probs, workbench sampler and vLLM side by side (log axis);
    vLLM's bars replaced by the reason when it did not run."""
    samplers = [("workbench", results[temperature])] + ([("vLLM", engine)] if engine.get("ran") else [])
    width = 0.38
    for k, mode in enumerate(("raw", "processed")):
        values = [max(s[mode]["max_ratio_deviation"], 1e-9) for _, s in samplers]
        ax.bar([i + (k - 0.5) * width for i in range(len(samplers))], values, width, color=MODE_COLORS[mode], label=MODES[mode])
    ax.set_yscale("log")
    ax.set_xlim(-0.6, 1.6)
    ax.set_xticks([0, 1], ["workbench", "vLLM"])
    ax.set_ylabel(f"max |ρ − 1| at τ = {temperature:g}")
    if not engine.get("ran"):
        ax.text(1, 0.5, "not run\n(reason printed)", transform=ax.get_xaxis_transform(), ha="center", va="center", fontsize=9,
                color=plots.NEUTRAL_COLOR)
    ax.legend(**plots.legend_outside(ax))


def figure_engine_logprobs(results: dict, engine: dict, temperature: float, tis_cap: float):
    fig, axes = plots.panel_grid(3, columns=2, panel_height=3.6)
    plot_ratio_vs_temperature(axes[0], results)
    plot_first_token(axes[1], results, tis_cap)
    plot_side_by_side(axes[2], results, engine, temperature)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def ratio_lines(results: dict) -> str:
    return "\n".join(f"τ={t:4}: max|ρ−1| raw {r['raw']['max_ratio_deviation']:.3e}, raw÷τ {r['raw/τ']['max_ratio_deviation']:.3e}, "
                     f"processed {r['processed']['max_ratio_deviation']:.1e}; first-token ρ raw {r['raw']['first_token_ratio']:.3f}; "
                     f"tokens above the TIS cap: raw {r['raw']['above_cap']:.1%}" for t, r in sorted(results.items()))


def engine_line(engine: dict) -> str:
    if not engine.get("ran"):
        return f"vLLM: {engine['reason']}"
    e = engine["engine"]
    return (f"vLLM {e['vllm']} (CPU, {e['dtype']}) at τ = {engine['temperature']:g}: raw_logprobs max|ρ−1| "
            f"{engine['raw']['max_ratio_deviation']:.3e} (first-token ρ {engine['raw']['first_token_ratio']:.3f}), "
            f"processed_logprobs {engine['processed']['max_ratio_deviation']:.1e}")


def headline_sentence(results: dict, engine: dict, temperature: float) -> str:
    reproduced, fixed = verdict(results, engine)
    r = results[temperature]
    where = "the workbench sampler" + (" and vLLM" if engine.get("ran") else " (vLLM not run)")
    return (f"At τ = {temperature:g} the step-0 ratio reaches max |ρ − 1| = {r['raw']['max_ratio_deviation']:.3g} with raw "
            f"log-probs and {r['raw/τ']['max_ratio_deviation']:.3g} with raw ÷ τ; processed log-probs leave "
            f"{r['processed']['max_ratio_deviation']:.1e}. Measured in {where}: "
            + ("reproduced" if reproduced else "not reproduced") + (", fixed." if fixed else ", NOT fixed."))


def engine_note(tis_cap: float, n_prompts: int) -> str:
    return (f"{n_prompts} prompts, up to 8 sampled tokens each, ρ = π_trainer(τ) / π_sampler before any update. Top left: "
            "the largest deviation per log-prob mode (log axis). Top right: the mean truncated importance weight "
            f"min(ρ, {tis_cap:g}) TRL's vLLM correction would apply (1 = no correction needed). Bottom: the workbench "
            "sampler and vLLM's CPU build on the same weights and prompts (fp32 both).")


# ---- explorer ------------------------------------------------------------------------------------
def logprobs_explorer(model, tokenizer, ids, mask, seed: int = 0) -> Explorer:
    """A slider for τ and a choice of log-prob mode: the histogram of log ρ at step 0 over the sampled tokens."""

    def draw(temperature, mode):
        kw = dict(max_new_tokens=8, temperature=temperature, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        with torch.no_grad(), one_thread_if_tiny(model):
            r = sample(model, ids, mask, logprobs_mode="processed" if mode == "processed" else "raw",
                       generator=torch.Generator().manual_seed(seed), **kw)
            trainer = response_logprobs(model, ids, mask, r.response_ids, r.response_mask, temperature=temperature)
        sampled = r.rollout_logprobs / temperature if mode == "raw/τ" else r.rollout_logprobs
        log_ratio = (trainer - sampled)[r.response_mask.bool()]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.hist(log_ratio.numpy(), bins=30, color=MODE_COLORS[mode])
        ax.set_xlabel("log ρ at step 0")
        ax.set_ylabel("tokens")
        ax.set_title(MODES[mode], fontsize=9)
        fig.tight_layout()
        return {"max_abs_log_ratio": float(log_ratio.abs().max())}

    controls = {"temperature": widgets.FloatSlider(value=0.6, min=0.3, max=1.5, step=0.1, description="τ"),
                "mode": widgets.Dropdown(options=[(v, k) for k, v in MODES.items()], value="raw", description="log-probs")}
    return Explorer(controls, draw, title="P47: log-probs before temperature from the sampler")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(results: dict, engine: dict, temperature: float, settings: dict) -> dict:
    reproduced, fixed = verdict(results, engine)
    return dict(
        notebook="47_engine_raw_logprobs", reproduced=reproduced, fixed=fixed,
        metrics={"by_temperature": {str(t): r for t, r in results.items()}, "engine": engine, "settings": settings},
        headline={"what": f"max |ρ − 1| at step 0, workbench sampler, τ = {temperature:g}", "unit": "ratio",
                  "bug": results[temperature]["raw"]["max_ratio_deviation"],
                  "fix": results[temperature]["processed"]["max_ratio_deviation"]},
    )
