"""Pitfall P36: correcting the rollout–training gap, measured as a gradient estimator.

The tokens a trainer learns from were sampled by a *rollout* policy μ — a bf16 or fp16 inference engine, weights k
updates old, or an engine that reports log-probs of the logits before the temperature divide — while the loss
differentiates the training policy π. Without a correction the update estimates E_μ[A ∇log π], not the policy
gradient E_π[A ∇log π]. verl 0.9.1 (``rollout_correction``, default ``decoupled_token_is``: token ratios truncated at
2) and TRL 1.16 (``vllm_importance_sampling_mode``, default ``sequence_mask``: sequence ratios above 3 zeroed) correct
it with importance weights and rejection masks (``workbench.core.rollout_correction``).

This module measures, on the tiny model and a CPU:

1. four gap sources of controlled size and what each does to verl's ``rollout_corr/`` diagnostics;
2. every correction as a gradient estimator: the bias and the variance of the output layer's policy gradient it
   gives, batch after batch, against the exact on-policy gradient estimated from a larger fp32 on-policy sample (the
   "gradient estimator trials" of verl's rollout-correction write-up);
3. GRPO under the largest gap the trainer can open, without a correction, with each library's default and with the
   estimator (2) ranks best, against a run without a gap.

The gradient is the output layer's, exact in closed form: ∂ log softmax(W h / τ)_y / ∂W = (e_y − p) hᵀ / τ, so every
estimator costs one weighted sum, not one backward pass (``head_gradients``; equal to autograd's in the tests). Its
advantage is leave-one-out (the reward minus the mean of the other responses to the same prompt), unbiased on-policy,
so any bias an estimator shows is the gap's.
"""

from __future__ import annotations

import copy
import math

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from workbench.core import progress
from workbench.core import rollout_correction as rc
from workbench.core.batching import repeated_rows
from workbench.experiments import statistics
from workbench.experiments.comparison import one_thread_if_tiny
from workbench.experiments.gradient_estimators import bias_variance
from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts, load_problems, score_responses, task_info
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.viz import plots
from workbench.viz.explorer import Explorer

NO_GAP, FP16, BF16, BEFORE_TEMPERATURE = "no gap", "fp16 sampler", "bf16 sampler", "log-probs before τ"
TRAINED_LAG = 4
"""The gap the training runs open: the sampler's weights ``TRAINED_LAG`` steps old (``rollout_staleness`` counts
optimiser updates; the notebook's GRPO settings make one per step, so steps and updates agree), the largest of the
gaps the trainer can open (``sampler_precision``, ``rollout_staleness``) on ``tiny-arith-qwen2``: mean |Δ log p| per token 0.039 nats
against 0.0093 (bf16), 0.0011 (fp16) and 0.012 (k = 1), measured before any training run and printed again by part 1."""
TRAINED = f"stale k={TRAINED_LAG}"  # the trained gap's source name (``stale_name(TRAINED_LAG)``)
Z_BIAS = 3.0
"""An estimator's bias counts as larger than its noise when the debiased squared bias exceeds this many null standard errors
(``bias_variance``; about 0.13 % one-sided under no bias) and is at least ``BIAS_FLOOR``."""
BIAS_FLOOR = 1e-4
"""A squared bias under this fraction of ‖g‖² (a bias under 1 % of the gradient) is not counted, however small its noise:
where the sampler is the trainer, weights of 1 ± 1e-7 give differences of float rounding only."""
FEATURE_ROWS = 1024  # rows per training forward of a pool: big enough to amortise a call, small enough to stay in cache
MAX_NEW_TOKENS = 6  # the GRPO learning settings' completion budget (docs/LEARNING.md)
ESTIMATORS: dict[str, object] = {
    "none": None,
    "verl token TIS (default)": "decoupled_token_is",
    "verl seq TIS": "decoupled_seq_is",
    "verl token IcePop": "decoupled_token_icepop",
    "verl seq IS + RS": "decoupled_seq_is_rs",
    "verl geo RS": "decoupled_geo_rs",
    "verl k3 RS": "k3_rs",
    "seq IS, uncapped": {"rollout_is": "sequence", "rollout_is_threshold": 1e8},
    "TRL sequence_mask (default)": "trl_sequence_mask",
    "TRL sequence_truncate": "trl_sequence_truncate",
    "TRL token_truncate": "trl_token_truncate",
    "TRL token_mask": "trl_token_mask",
}
"""Each correction by its reader's name: ``None`` (no correction) or a ``rollout_correction`` setting (a preset of
``core.rollout_correction.PRESETS`` or a dict of verl's keywords), exactly what the trainer's option takes."""
DEFAULTS = ("TRL sequence_mask (default)", "verl token TIS (default)")
NO_GAP_RUN = "no gap"


# ---- measurements --------------------------------------------------------------------------------
def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """A_i = R_i − mean of the other responses' rewards to the same prompt (rewards laid out group after group): a
    baseline independent of y_i, so E_π[A ∇log π(y)] is the policy gradient exactly (RLOO)."""
    groups = rewards.reshape(-1, group_size)
    others = (groups.sum(1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)


@torch.no_grad()
def head_features(model, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature: float = 1.0,
                  report_temperature: float | None = None) -> dict:
    """What the output layer's gradient of each response token needs: ``logp`` (B, T) log π(y_t) at ``temperature``,
    ``dlogits`` (B, T, V) (e_y − softmax(z / τ)) / τ and ``hidden`` (B, T, H) the output layer's input, so that
    ∂ log π(y_t) / ∂W = dlogits_t ⊗ hidden_t (W: the output layer's weight, V × H). With ``report_temperature``:
    also ``reported`` (B, T), log π(y_t) at that temperature, from the same logits.

    The prompt forward runs once per distinct prompt row and its KV cache is copied to the rows that repeat it (as
    ``sample(share_prefill=True)`` does); the responses run on that cache: a trial pool repeats each prompt
    ``group_size`` × ``batches`` times, and the prompt is most of a row's tokens."""
    head = model.get_output_embeddings()
    captured = []
    handle = head.register_forward_hook(lambda module, inputs, output: captured.append(inputs[0]))
    try:
        mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], 1)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        width = prompt_ids.shape[1]
        repeated = repeated_rows(torch.cat([prompt_ids, prompt_mask], 1))
        first, inverse = (torch.arange(prompt_ids.shape[0]), None) if repeated is None else (
            torch.tensor([members[0] for members in repeated[1]], dtype=torch.long), repeated[0])
        prefill = model(input_ids=prompt_ids[first], attention_mask=prompt_mask[first], position_ids=positions[first, :width],
                        use_cache=True)
        cache = prefill.past_key_values
        last = slice(None) if inverse is None else inverse
        if inverse is not None:
            cache.reorder_cache(inverse)
        logits, hidden = [prefill.logits[last, -1:]], [captured[0][last, -1:]]
        if response_ids.shape[1] > 1:  # the last response token predicts nothing that is scored
            rest = model(input_ids=response_ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, width:-1],
                         past_key_values=cache, use_cache=True)
            logits.append(rest.logits)
            hidden.append(captured[1])
    finally:
        handle.remove()
    scaled = torch.cat(logits, 1).float() / temperature
    hidden = torch.cat(hidden, 1).float()
    logp_all = scaled.log_softmax(-1)
    logp = logp_all.gather(-1, response_ids[..., None]).squeeze(-1)
    onehot = torch.nn.functional.one_hot(response_ids, scaled.shape[-1]).float()
    out = {"logp": logp, "dlogits": (onehot - logp_all.exp()) / temperature, "hidden": hidden}
    if report_temperature is not None:
        raw = scaled * temperature / report_temperature
        out["reported"] = raw.log_softmax(-1).gather(-1, response_ids[..., None]).squeeze(-1)
    return out


def head_gradients(coefficients: torch.Tensor, dlogits: torch.Tensor, hidden: torch.Tensor, batches: int) -> torch.Tensor:
    """The output layer's gradient of Σ_t c_t log π(y_t) per batch, divided by the batch's rows: ``coefficients``
    (N, T) (A_i × weight × mask), ``dlogits`` (N, T, V), ``hidden`` (N, T, H), rows laid out batch after batch.
    Returns (batches, V · H)."""
    rows = coefficients.shape[0] // batches
    c = coefficients.reshape(batches, -1)
    d = dlogits.reshape(batches, c.shape[1], -1)
    h = hidden.reshape(batches, c.shape[1], -1)
    return torch.einsum("mnv,mn,mnh->mvh", d, c, h).reshape(batches, -1) / rows


def estimator_weights(spec, trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token weight × kept-mask (B, T) of a correction (``ESTIMATORS``' values; None: the mask itself), computed by
    ``core.rollout_correction.apply`` with π_old = ``trainer_logp`` as the trainer does."""
    if spec is None:
        return mask.float()
    result = rc.apply(rc.resolve(spec), trainer_logp, rollout_logp, mask)
    weights = mask.float() if result.weights is None else result.weights.float()
    return weights * result.mask.float()


def weight_summary(weights: torch.Tensor, mask: torch.Tensor) -> dict:
    """Of the response tokens' weights: the share zeroed (masked), the effective sample size (Σw)² / (n Σw²) as a share
    of the tokens, and the mean weight."""
    w = weights[mask.bool()].double()
    square = float((w * w).sum())
    return {"masked_share": float((w == 0).double().mean()), "ess_share": float(w.sum() ** 2 / (w.numel() * square)) if square > 0 else 0.0,
            "mean_weight": float(w.mean())}


def gap_diagnostics(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """verl's ``rollout_corr/`` mismatch metrics of one pool of responses, and per row: k1 = mean over its tokens of
    log μ − log π (mean ± s.e. over rows: > 0 when μ is another policy whose log-probs are reported right, E = KL(μ‖π);
    ≤ 0 when the samples are π's and only the reported log-probs differ, E = −KL(π‖μ)), and mean |Δ log p| per token."""
    metrics = {k.removeprefix(rc.PREFIX): v for k, v in rc.mismatch_metrics(trainer_logp, rollout_logp, mask).items()}
    keep = mask.bool()
    difference = torch.where(keep, rollout_logp - trainer_logp, torch.zeros(()))
    rows = keep.any(1)
    k1 = (difference.sum(1) / keep.sum(1).clamp(min=1))[rows].double()
    return {**metrics, "k1_row_mean": float(k1.mean()), "k1_row_se": float(k1.std() / math.sqrt(k1.numel())),
            "mean_abs_gap": float(difference[keep].abs().mean())}


# ---- sweeps --------------------------------------------------------------------------------------
def stale_name(lag: int) -> str:
    return f"stale k={lag}"


def bug_run(lag: int) -> str:
    return f"stale k={lag}, no correction"


def corrected_run(name: str) -> str:
    return f"stale + {name}"


def stale_actors(model, tokenizer, lags, *, task: str = "arith", seed: int = 0, **settings) -> dict:
    """``{k: the policy after k GRPO steps}`` for each lag k of ``lags`` (all training prompts of ``task``): the training
    policy of a sampler whose weights are k steps old. ``settings``: ``GRPOConfig`` fields (the notebook passes its
    training runs' ``learning_settings``; ``steps`` is replaced by the largest lag); unset, 32 prompts × 8 per step,
    ``MAX_NEW_TOKENS``, seq-mean-token-mean."""
    actor = copy.deepcopy(model)
    config = GRPOConfig(**{"prompts_per_step": 32, "num_generations": 8, "max_new_tokens": MAX_NEW_TOKENS,
                           "loss_agg": "seq-mean-token-mean", **settings, "steps": max(lags), "seed": seed, "progress": False})
    snapshots = {}

    def keep(record):
        if record["step"] + 1 in lags:
            snapshots[record["step"] + 1] = copy.deepcopy(actor).eval()

    with one_thread_if_tiny(actor):
        GRPOTrainer(actor, tokenizer, load_problems(task_info(task).train_prompts), config).train(on_step=keep)
    return snapshots


def gap_sources(model, actors: dict, temperature: float) -> dict[str, dict]:
    """The gaps, each ``{"sampler", "trainer", "temperature", "report_temperature"}`` (``report_temperature`` None: the
    sampler reports its own log-probs): no gap, fp16 and bf16 copies sampling, samplers ``k`` steps old (``actors``),
    and a sampler at ``temperature`` reporting the log-probs of its logits before the temperature divide."""
    sources = {NO_GAP: {"sampler": model, "trainer": model, "temperature": 1.0, "report_temperature": None}}
    for name, dtype in ((FP16, torch.float16), (BF16, torch.bfloat16)):
        sources[name] = {"sampler": copy.deepcopy(model).to(dtype), "trainer": model, "temperature": 1.0, "report_temperature": None}
    for lag, actor in sorted(actors.items()):
        sources[stale_name(lag)] = {"sampler": model, "trainer": actor, "temperature": 1.0, "report_temperature": None}
    sources[BEFORE_TEMPERATURE] = {"sampler": model, "trainer": model, "temperature": temperature, "report_temperature": 1.0}
    return sources


@torch.no_grad()
def draw_responses(sampler, tokenizer, problems, *, batches: int, group_size: int, temperature: float = 1.0, seed: int = 0,
                   encoded: tuple | None = None) -> dict:
    """``batches`` batches of ``group_size`` responses to each of ``problems``, sampled by ``sampler`` at ``temperature``
    in one call by inverse-CDF draws from generator ``seed`` (two draws of one seed use the same uniforms row by row:
    where the two samplers agree they draw the same tokens), with the sampler's own log-probs (``rollout_logp``), the
    rewards and leave-one-out advantages. Rows batch after batch; ``encoded``: the rows' ``encode_prompts``, when known."""
    repeated = [p for p in problems for _ in range(group_size)] * batches
    ids, mask = encoded if encoded is not None else encode_prompts(tokenizer, [p.prompt for p in repeated])
    rollout = sample(sampler, ids, mask, max_new_tokens=MAX_NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, temperature=temperature, draw="inverse_cdf",
                     share_prefill=True, static_cache=True, generator=torch.Generator().manual_seed(seed))
    rewards = score_responses(tokenizer, repeated, rollout.response_ids, rollout.response_mask, rollout.finished)
    return {"ids": ids, "mask": mask, "response_ids": rollout.response_ids, "response_mask": rollout.response_mask,
            "rollout_logp": rollout.rollout_logprobs.float(), "rewards": rewards,
            "advantages": leave_one_out_advantages(rewards, group_size), "batches": batches}


@torch.no_grad()
def pool_features(drawn: dict, trainer, *, temperature: float = 1.0, report_temperature: float | None = None) -> dict:
    """A pool of responses (``draw_responses``) as the trainer sees it: the training policy's log-probs and output-layer
    features at ``temperature`` (``head_features``), the sampler's reported log-probs (``rollout_logp``: its own), the
    mask and the advantages, responses right-padded to ``MAX_NEW_TOKENS``. With ``report_temperature`` (only where
    ``trainer`` is the sampler): also ``reported``, the log-probs at that temperature of the same forward."""
    chunks = [head_features(trainer, drawn["ids"][rows], drawn["mask"][rows], drawn["response_ids"][rows],
                            drawn["response_mask"][rows], temperature=temperature, report_temperature=report_temperature)
              for rows in torch.arange(drawn["ids"].shape[0]).split(FEATURE_ROWS)]
    features = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
    pad = MAX_NEW_TOKENS - drawn["response_ids"].shape[1]
    response_mask = drawn["response_mask"].float()

    def padded(logp):
        return torch.nn.functional.pad(logp * response_mask, (0, pad))

    pool = {"trainer_logp": padded(features["logp"]), "rollout_logp": padded(drawn["rollout_logp"]),
            "mask": torch.nn.functional.pad(response_mask, (0, pad)),
            "dlogits": torch.nn.functional.pad(features["dlogits"], (0, 0, 0, pad)),
            "hidden": torch.nn.functional.pad(features["hidden"], (0, 0, 0, pad)),
            "rewards": drawn["rewards"], "advantages": drawn["advantages"], "batches": drawn["batches"]}
    if report_temperature is not None:
        pool["reported"] = padded(features["reported"])
    return pool


def pool_gradients(pool: dict, weights: torch.Tensor) -> torch.Tensor:
    """Per-batch output-layer gradients (``head_gradients``) of a pool under per-token ``weights`` (B, T)."""
    coefficients = pool["advantages"][:, None] * weights * pool["mask"]
    return head_gradients(coefficients, pool["dlogits"], pool["hidden"], pool["batches"])


def estimator_trials(sources: dict, tokenizer, problems, *, trials: int, group_size: int, seed: int = 0,
                     estimators: dict = ESTIMATORS) -> dict:
    """For every gap source: the diagnostics of ``trials`` batches it samples, and for every estimator the bias and
    variance (``bias_variance``) of its per-batch output-layer gradients against the on-policy gradients of ``trials``
    batches the training policy samples itself with the same random numbers (one reference per training policy and
    temperature). Returns ``{"sources": {name: {"diagnostics", "estimators": {name: stats + weight_summary}, "pool"}},
    "trials", "group_size", "prompts"}``; a pool keeps only its log-probs, mask and advantages.

    Nothing is sampled or scored twice: one draw per sampler and temperature (the stale sources' samples are the no-gap
    reference's tokens, scored by the older trainer), and a source whose sampler is its trainer but reports log-probs at
    another temperature is its reference with those log-probs (the same forward). Runs on one thread for a tiny
    model (``one_thread_if_tiny``)."""
    reports = {}
    for name, source in sources.items():
        if source["report_temperature"] is not None:
            if source["sampler"] is not source["trainer"]:
                raise ValueError(f"source {name!r}: log-probs at another temperature are rescored by the trainer, "
                                 "so it must be the sampler")
            reports[(id(source["trainer"]), source["temperature"])] = source["report_temperature"]
    draws: dict = {}
    references: dict = {}
    encoded = encode_prompts(tokenizer, [p.prompt for p in problems for _ in range(group_size)] * trials)

    def drawn(sampler, temperature):
        key = (id(sampler), temperature)
        if key not in draws:
            draws[key] = draw_responses(sampler, tokenizer, problems, batches=trials, group_size=group_size,
                                        temperature=temperature, seed=seed, encoded=encoded)
        return draws[key]

    out = {}
    with one_thread_if_tiny(next(iter(sources.values()))["trainer"]):
        for name, source in progress.track(sources.items(), "estimator trials", unit="source"):
            trainer, temperature = source["trainer"], source["temperature"]
            key = (id(trainer), temperature)
            if key not in references:
                reference = pool_features(drawn(trainer, temperature), trainer, temperature=temperature,
                                          report_temperature=reports.get(key))
                references[key] = (reference, pool_gradients(reference, reference["mask"]))
            reference, reference_gradients = references[key]
            if source["sampler"] is not trainer:
                pool = pool_features(drawn(source["sampler"], temperature), trainer, temperature=temperature)
            elif source["report_temperature"] is not None:  # π's samples, log-probs reported at another temperature
                pool = {**reference, "rollout_logp": reference["reported"]}
            else:  # the reference itself
                pool = reference
            stats = {}
            for label, spec in estimators.items():
                weights = estimator_weights(spec, pool["trainer_logp"], pool["rollout_logp"], pool["mask"])
                stats[label] = {**bias_variance(pool_gradients(pool, weights), reference_gradients),
                                **weight_summary(weights, pool["mask"])}
            out[name] = {"diagnostics": gap_diagnostics(pool["trainer_logp"], pool["rollout_logp"], pool["mask"]), "estimators": stats,
                         "pool": {k: pool[k] for k in ("trainer_logp", "rollout_logp", "mask", "advantages")}}
    return {"sources": out, "trials": trials, "group_size": group_size, "prompts": len(problems)}


def largest_trainable_gap(trials: dict) -> str:
    """Of the gaps the trainer can open (the fp16 and bf16 samplers, the stale ones), the one with the largest mean
    |Δ log p| per token."""
    trainable = [n for n in trials["sources"] if n in (FP16, BF16) or n.startswith("stale")]
    return max(trainable, key=lambda n: trials["sources"][n]["diagnostics"]["mean_abs_gap"])


def biased(stats: dict) -> bool:
    """An estimator's bias is larger than its noise: z > ``Z_BIAS`` and squared bias ≥ ``BIAS_FLOOR`` of ‖g‖²."""
    return stats["z"] > Z_BIAS and stats["bias2"] >= BIAS_FLOOR


def best_estimator(trials: dict, source: str) -> str:
    """The correction (any estimator but "none") ranked best on ``source``: of those whose bias is within the noise, the one
    with the smallest variance per batch (a bias adds up over the steps of a run, the noise of a batch averages out);
    when every correction is biased, the one with the smallest mean squared error per batch."""
    stats = trials["sources"][source]["estimators"]
    corrections = [n for n in stats if ESTIMATORS.get(n) is not None]
    unbiased = [n for n in corrections if not biased(stats[n])]
    return min(unbiased, key=lambda n: stats[n]["variance"]) if unbiased else min(corrections, key=lambda n: stats[n]["mse"])


def headline_row(trials: dict, source: str, best: str) -> dict:
    """What the report leads with: the debiased squared bias (relative to ‖g‖²) of no correction and of ``best`` on
    ``source``, and their z against the noise."""
    stats = trials["sources"][source]["estimators"]
    return {"source": source, "best": best, "bug": stats["none"]["bias2"], "fix": stats[best]["bias2"],
            "bug_z": stats["none"]["z"], "fix_z": stats[best]["z"]}


def training_variants(lag: int, best: str) -> dict[str, dict]:
    """The GRPO runs: no gap; a sampler ``lag`` steps old without correction; with TRL's and verl's defaults; with
    ``best`` (once, when it is not a default)."""
    variants = {NO_GAP_RUN: {}, bug_run(lag): {"rollout_staleness": lag}}
    for name in dict.fromkeys((*DEFAULTS, best)):
        variants[corrected_run(name)] = {"rollout_staleness": lag, "rollout_correction": ESTIMATORS[name]}
    return variants


def training_effects(runs: dict, lag: int) -> dict:
    """``{"reward": …, "heldout_accuracy": …}``: the stale run without correction (bug) against no gap (fix)."""
    return {key: statistics.effect(runs, key, bug_run(lag), NO_GAP_RUN) for key in ("reward", "heldout_accuracy")}


def correction_effects(runs: dict, lag: int) -> dict:
    """``{("reward", run): effect of run against no gap}`` for every corrected stale run (their held-out gains are in
    ``statistics.training_summary``'s table)."""
    return {("reward", label): statistics.effect(runs, "reward", label, NO_GAP_RUN) for label in runs
            if label not in (NO_GAP_RUN, bug_run(lag))}


# ---- verdict -------------------------------------------------------------------------------------
def verdict(trials: dict, source: str, best: str) -> tuple[bool, bool]:
    """(reproduced, fixed) on the trained gap ``source``. Reproduced: the diagnostics flag the gap (k3 KL > 0) and the
    uncorrected gradient's bias exceeds its noise (``biased``). Fixed: the correction ranked best (``best``) leaves a
    bias within the noise."""
    entry = trials["sources"][source]
    stats = entry["estimators"]
    if stats["none"].get("no_signal"):  # no gradient: nothing was measured either way (``not_shown`` says why)
        return False, False
    reproduced = entry["diagnostics"]["k3_kl"] > 0 and biased(stats["none"])
    return bool(reproduced), not biased(stats[best])


def not_shown(trials: dict, source: str) -> str | None:
    """Why this checkpoint cannot show the bias, or None: when the gap it opens biases the uncorrected gradient by less
    than the noise of these trials, no correction has anything to remove."""
    entry = trials["sources"][source]
    z = entry["estimators"]["none"]["z"]
    if entry["estimators"]["none"].get("no_signal"):
        return ("this checkpoint earns no reward on these prompts, so every advantage is 0 and the on-policy gradient is 0: "
                "there is no gradient for a gap to bias; use a checkpoint that solves some prompts")
    if biased(entry["estimators"]["none"]):
        return None
    return (f"the {source} gap of this checkpoint (mean |Δ log p| {entry['diagnostics']['mean_abs_gap']:.2g} nats per token) biases "
            f"the uncorrected gradient by {z:.1f} standard errors only (needs > {Z_BIAS:g}) over {trials['trials']} batches: "
            "more trials or a larger gap are needed to see what a correction removes")


# Stated before any run: a sampler TRAINED_LAG steps old samples the policy of TRAINED_LAG steps ago, so the batches the
# trainer learns from (and their reward) lag the policy, and the uncorrected update is the biased E_μ[A ∇log π]: the
# reward of the sampled batches is lower than without a gap.
PREDICTION = statistics.Prediction(
    "reward", f"task reward of the sampled batches, sampler {TRAINED_LAG} steps stale without correction vs no gap", "-")


# ---- figures -------------------------------------------------------------------------------------
def _bar_colors(names, bug: str | None = None, fix: str | None = None) -> list[str]:
    return [plots.BUG_COLOR if n == bug else plots.FIX_COLOR if n == fix else plots.NEUTRAL_COLOR for n in names]


def plot_diagnostics(axes, trials: dict, trained: str) -> None:
    """Left: k3 KL (``rollout_corr/k3_kl``) per gap source. Right: k1 per row, mean ± 2 s.e.: its sign tells a sampler
    that is another policy (> 0) from wrong reported log-probs (< 0)."""
    names = list(trials["sources"])
    diagnostics = [trials["sources"][n]["diagnostics"] for n in names]
    y = np.arange(len(names))
    axes[0].barh(y, [d["k3_kl"] for d in diagnostics], color=_bar_colors(names, trained))
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("k3 KL per token (nats)")
    axes[1].errorbar([d["k1_row_mean"] for d in diagnostics], y, xerr=[2 * d["k1_row_se"] for d in diagnostics], fmt="o",
                     color=plots.NEUTRAL_COLOR, ecolor=plots.NEUTRAL_COLOR, capsize=3)
    axes[1].axvline(0, color=plots.NEUTRAL_COLOR, lw=0.8, ls="--")
    axes[1].set_yticks(y, [""] * len(names))
    axes[1].invert_yaxis()
    axes[1].set_xlabel("k1 = mean log μ − log π per row (± 2 s.e.)")
    axes[1].xaxis.set_major_locator(MaxNLocator(4))
    axes[0].xaxis.set_major_locator(MaxNLocator(4))


def figure_diagnostics(trials: dict, trained: str):
    return plots.figure_row(lambda axes: plot_diagnostics(axes, trials, trained), 2, (plots.NOTEBOOK_WIDTH, 3.2))


def plot_estimators(axes, trials: dict, source: str, best: str) -> None:
    """Left: each estimator's debiased squared bias (relative to ‖g‖², ± 2 jackknife s.e.); right: its variance per batch."""
    stats = trials["sources"][source]["estimators"]
    names = list(stats)
    y = np.arange(len(names))
    colors = _bar_colors(names, "none", best)
    axes[0].barh(y, [stats[n]["bias2"] for n in names], xerr=[2 * stats[n]["bias2_se"] for n in names], color=colors,
                 error_kw={"ecolor": "black", "capsize": 2, "lw": 0.8})
    axes[0].axvline(0, color="black", lw=0.8)
    # the axis spans the uncorrected and the best estimator's bias (× 4): a correction that zeroes the gradient (squared bias
    # ≈ 1) would flatten them to nothing; its bar runs off the axis and its value is written at the edge
    edge = 4 * max(abs(stats[n]["bias2"]) + 2 * stats[n]["bias2_se"] for n in ("none", best))
    low = min(0.0, min(stats[n]["bias2"] - 2 * stats[n]["bias2_se"] for n in names))
    axes[0].set_xlim(max(low, -edge / 2), edge)
    for i, n in enumerate(names):
        if stats[n]["bias2"] > edge:
            axes[0].text(edge, i, f"{stats[n]['bias2']:.2f} →", ha="right", va="center", fontsize=8, color="white")
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("squared bias / ‖g‖² (± 2 jackknife s.e.)")
    axes[1].barh(y, [stats[n]["variance"] for n in names], xerr=[2 * stats[n]["variance_se"] for n in names], color=colors,
                 error_kw={"ecolor": "black", "capsize": 2, "lw": 0.8})
    axes[1].set_yticks(y, [""] * len(names))
    axes[1].invert_yaxis()
    axes[1].set_xlabel("variance of one batch / ‖g‖²")


def figure_estimators(trials: dict, source: str, best: str):
    return plots.figure_row(lambda axes: plot_estimators(axes, trials, source, best), 2, (plots.NOTEBOOK_WIDTH, 4.2))


def plot_bias_map(ax, trials: dict) -> None:
    """z of each estimator's bias (debiased squared bias / its s.e. under no bias) per gap source, written in each cell."""
    sources = list(trials["sources"])
    names = list(next(iter(trials["sources"].values()))["estimators"])
    z = np.array([[trials["sources"][s]["estimators"][n]["z"] for s in sources] for n in names])
    shown = np.clip(z, -Z_BIAS * 3, Z_BIAS * 3)
    image = ax.imshow(shown, cmap="RdBu_r", vmin=-Z_BIAS * 3, vmax=Z_BIAS * 3, aspect="auto")
    for (i, j), value in np.ndenumerate(z):
        bold = biased(trials["sources"][sources[j]]["estimators"][names[i]])
        ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8,
                color=plots.label_color(image.cmap(image.norm(shown[i, j]))), fontweight="bold" if bold else "normal")
    ax.set_xticks(range(len(sources)), [s.replace(" sampler", "").replace("log-probs ", "") for s in sources])
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("gap source (bold: bias larger than its noise)")


def figure_bias_map(trials: dict):
    return plots.figure_panels((plots.NOTEBOOK_WIDTH, 4.6), lambda ax: plot_bias_map(ax, trials))


def plot_training(axes, runs: dict, steps: int) -> None:
    """Sampled reward per step, mean ± std over seeds, and held-out accuracy before and after, per run."""
    labels = list(runs)
    colors = {label: plots.FIX_COLOR if label == NO_GAP_RUN else plots.BUG_COLOR if "no correction" in label
              else plots.SERIES_COLORS[i % len(plots.SERIES_COLORS)] for i, label in enumerate(labels)}
    plots.plot_bands(axes[0], runs, "reward", "sampled reward", colors, window=max(1, steps // 10),
                     legend_kw={**plots.LEGEND_BELOW, "bbox_to_anchor": (0.5, -0.3)})
    plots.plot_heldout(axes[1], runs, colors)


def figure_training(runs: dict, steps: int):
    return plots.figure_row(lambda axes: plot_training(axes, runs, steps), 2, (plots.NOTEBOOK_WIDTH, 4.6), columns=1)


# ---- printers ------------------------------------------------------------------------------------
def diagnostics_lines(trials: dict) -> str:
    rows = []
    for name, entry in trials["sources"].items():
        d = entry["diagnostics"]
        rows.append(f"{name:>20}: mean |Δ log p| {d['mean_abs_gap']:.2g} nats/token, k3 KL {d['k3_kl']:.2g}, "
                    f"k1 per row {d['k1_row_mean']:+.2g} ± {d['k1_row_se']:.1g}, χ² token {d['chi2_token']:.2g}, "
                    f"χ² seq {d['chi2_seq']:.2g}, |log ppl diff| {d['log_ppl_abs_diff']:.2g}")
    return "\n".join(rows)


def diagnostics_sentence(trials: dict, trained: str) -> str:
    """Which metric sees which source, from the numbers: the sign of k1 beyond 3 s.e., and the largest trainable gap."""
    sources = trials["sources"]
    negative = [n for n, e in sources.items() if e["diagnostics"]["k1_row_mean"] < -3 * e["diagnostics"]["k1_row_se"]]
    positive = [n for n, e in sources.items() if e["diagnostics"]["k1_row_mean"] > 3 * e["diagnostics"]["k1_row_se"]]
    largest = largest_trainable_gap(trials)
    text = (f"k1 below 0 by > 3 s.e. (the samples are π's, the reported log-probs wrong): {', '.join(negative) or 'none'}; "
            f"above 0 by > 3 s.e. (another policy sampled): {', '.join(positive) or 'none'}; "
            f"the others' k1 is within noise, and only k3 KL, χ² and |log ppl diff| see them. ")
    return text + (f"Largest gap the trainer can open: {largest}" + (", the one trained below." if largest == trained
                   else f"; the training below opens {trained} (fixed before the runs)."))


def trials_table(trials: dict) -> str:
    """One line per estimator: relative squared bias ± s.e. and variance per batch, per gap source."""
    sources = list(trials["sources"])
    names = list(next(iter(trials["sources"].values()))["estimators"])
    header = f"{'estimator':<28}" + "".join(f"{s:>30}" for s in sources)
    lines = [f"squared bias / ‖g‖² ± jackknife s.e. | variance per batch / ‖g‖² ({trials['trials']} batches of {trials['prompts']} prompts "
             f"× {trials['group_size']}, each paired with an on-policy batch of the same random numbers)", header]
    for n in names:
        cells = []
        for s in sources:
            e = trials["sources"][s]["estimators"][n]
            mark = "*" if biased(e) else " "
            cells.append(f"{e['bias2']:+.3f}±{e['bias2_se']:.3f}{mark}| {e['variance']:.2f}".rjust(30))
        lines.append(f"{n:<28}" + "".join(cells))
    lines.append(f"* bias larger than its noise: z > {Z_BIAS:g} (s.e. under no bias) and ≥ {BIAS_FLOOR:g} of ‖g‖²; "
                 "± : the delete-one jackknife over batches, the reference's noise included")
    return "\n".join(lines)


def best_sentence(trials: dict, source: str, best: str) -> str:
    stats = trials["sources"][source]["estimators"]
    none, top = stats["none"], stats[best]
    return (f"On {source}: no correction gives squared bias {none['bias2']:.3f} ± {none['bias2_se']:.3f} of ‖g‖² "
            f"(z {none['z']:.1f}), variance {none['variance']:.2f}; the correction ranked best (bias within noise, least "
            f"variance), {best}, gives "
            f"{top['bias2']:.3f} ± {top['bias2_se']:.3f} (z {top['z']:.1f}), variance {top['variance']:.2f}, "
            f"masking {top['masked_share']:.1%} of the tokens (ESS {top['ess_share']:.1%}).")


def training_lines(effects: dict, corrections: dict, runs: dict, task: str) -> str:
    """``statistics.training_summary`` of the uncorrected stale run against no gap, then each corrected run against no gap."""
    lines = [statistics.training_summary(effects, runs, PREDICTION, task), "", "each corrected stale run against no gap:"]
    lines += [f"{label}: {effect.sentence()}" for (_, label), effect in corrections.items()]
    return "\n".join(lines)


def estimators_note(source: str) -> str:
    return (f"Output layer's policy gradient on {source}; vermilion: no correction, blue: the correction ranked best (bias within "
            "noise, least variance); error bars ± 2 s.e. (delete-one jackknife over the paired batches). A squared bias below 0 "
            "is noise around 0 (it is debiased).")


# ---- explorer ------------------------------------------------------------------------------------
def weights_explorer(trials: dict, source: str | None = None) -> Explorer:
    """Gap source × estimator: the histogram of the response tokens' weights, the masked share and the ESS."""
    sources = trials["sources"]

    def draw(source, estimator):
        pool = sources[source]["pool"]
        weights = estimator_weights(ESTIMATORS[estimator], pool["trainer_logp"], pool["rollout_logp"], pool["mask"])
        summary = weight_summary(weights, pool["mask"])
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.hist(weights[pool["mask"].bool()].numpy(), bins=50, color=plots.SERIES_COLORS[1])
        ax.set_xlabel("token weight (0: masked)")
        ax.set_ylabel("tokens")
        ax.set_title(f"{source}, {estimator}: masked {summary['masked_share']:.1%}, ESS {summary['ess_share']:.1%}", fontsize=9)
        return summary

    names = list(sources)
    return Explorer({"source": widgets.Dropdown(options=names, value=source or names[-1], description="gap"),
                     "estimator": widgets.Dropdown(options=list(ESTIMATORS), value=DEFAULTS[1], description="estimator")},
                    draw, "P36: the weights a correction gives")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(*, trials: dict, trained: str, best: str, runs: dict, effects: dict, corrections: dict, settings: dict,
            task: str = "arith") -> dict:
    """Notebook 36's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(trials, trained, best)
    head = headline_row(trials, trained, best)
    return {
        "notebook": "36_rollout_correction", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(trials, trained),
        "metrics": {"trained_gap": trained, "best_estimator": best, "z_bias": Z_BIAS,
                    "diagnostics": {n: e["diagnostics"] for n, e in trials["sources"].items()},
                    "estimators": {n: e["estimators"] for n, e in trials["sources"].items()},
                    "trials": trials["trials"], "group_size": trials["group_size"], "prompts": trials["prompts"],
                    "training_effects": {k: vars(e) for k, e in effects.items()},
                    "correction_effects": {f"{key}: {label}": vars(e) for (key, label), e in corrections.items()},
                    "prediction": PREDICTION.record(effects, task),
                    "heldout_gain": statistics.heldout_gains(runs), "training_settings": settings},
        "headline": {"what": f"squared bias of the output layer's gradient / ‖g‖² on {trained}: no correction vs {best}",
                     "unit": "fraction of ‖g‖²", "bug": head["bug"], "fix": head["fix"]},
    }
