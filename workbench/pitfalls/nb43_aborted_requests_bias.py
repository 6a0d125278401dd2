"""Pitfall P43: in-flight requests aborted at a weight update — the responses that survive are biased short.

An asynchronous RL rollout engine keeps decoding while the trainer pushes new weights. If the update aborts every
request in flight (miles PR #2589, merged 2026-08: the weight-version bump called sglang's ``/update_weight_version``,
whose ``abort_all_requests`` defaults to True; each aborted turn came back with ``finish_reason: "abort"`` and
``check_no_aborted`` dropped its whole group — about 65 aborts per update on a 16-node run), the samples that reach the
trainer are the ones that happened to finish between two updates. A request of L decode steps that starts at a random
point of an update cycle of U steps survives with probability

    P(kept | L) = max(0, 1 − L / U),

so long responses are dropped more often and the trained batch is shorter than the policy's responses. Where the
reward correlates with length (on the sums task, long sums are harder: corr < 0), the logged reward is biased too, and
the policy is trained on a length-filtered sample — an implicit length preference no loss curve shows. The fix:
pause generation in place and resume the in-flight requests under the new weights (what #2589 restores), or requeue
aborted requests as partial rollouts; every sample then reaches the trainer (its tokens span two weight versions: an
off-policy share that the importance correction of notebooks 28 and 36 handles).

Measured here: response lengths and rewards of the tiny sums policy, then a continuous-batching engine simulated
step by step with both update behaviours, over seeds and update intervals.
"""

from __future__ import annotations

import math
import random

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts, rl_problems, score_responses
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements -------------------------------------------------------------------------------
@torch.no_grad()
def response_pool(model, tokenizer, n_prompts: int, group_size: int, *, max_new_tokens: int = 48, seed: int = 0) -> dict:
    """``group_size`` sampled responses to each of ``n_prompts`` sums problems: their ``lengths`` (decode steps,
    EOS included) and ``rewards``, grouped by prompt, plus the length–reward correlation of the policy's responses."""
    problems = [p for p in rl_problems(n_prompts, task="sums") for _ in range(group_size)]
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    rewards = score_responses(tokenizer, problems, rollout.response_ids, rollout.response_mask, rollout.finished).float()
    lengths = rollout.response_mask.sum(-1).float()
    return {"lengths": lengths.view(n_prompts, group_size).cpu(), "rewards": rewards.view(n_prompts, group_size).cpu(),
            "group_size": group_size, "length_reward_corr": float(torch.corrcoef(torch.stack([lengths, rewards]))[0, 1])}


def simulate_engine(lengths: torch.Tensor, *, slots: int, update_interval: int, abort_on_update: bool,
                    seed: int = 0, phase: int | None = None) -> dict:
    """A continuous-batching engine decoding one token per step for up to ``slots`` requests; the groups (rows of
    ``lengths``) are submitted in a random order, a group's requests together; a weight update lands every
    ``update_interval`` steps (at the steps ≡ ``phase``, random by default). With ``abort_on_update`` every request
    in flight is aborted and its group dropped (the bug); without, in-flight requests resume under the new weights
    (the fix). Returns ``kept`` (groups × samples, bool), ``aborted`` (how many requests were) and ``steps``."""
    rng = random.Random(seed)
    n_groups, group_size = lengths.shape
    order = list(range(n_groups))
    rng.shuffle(order)
    queue = [(g, i) for g in order for i in range(group_size)]
    phase = rng.randrange(update_interval) if phase is None else phase
    running: dict[tuple[int, int], int] = {}  # (group, sample) → decode steps left
    dropped, aborted, step = set(), 0, 0
    while queue or running:
        while queue and len(running) < slots:
            request = queue.pop(0)
            running[request] = int(lengths[request])
        step += 1
        for request in list(running):
            running[request] -= 1
            if running[request] == 0:
                del running[request]
        if abort_on_update and step % update_interval == phase and running:
            aborted += len(running)
            dropped.update(g for g, _ in running)
            running.clear()
    kept = torch.ones(n_groups, group_size, dtype=torch.bool)
    kept[sorted(dropped)] = False
    return {"kept": kept, "aborted": aborted, "steps": step}


def survival_theory(length: torch.Tensor, update_interval: int) -> torch.Tensor:
    """P(a lone request of ``length`` steps finishes between two updates) = max(0, 1 − L / U)."""
    return (1 - length / update_interval).clamp(min=0)


def mean_and_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error over seeds (s.e. 0 for one seed)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


# ---- sweeps -------------------------------------------------------------------------------------
def abort_effects(pool: dict, *, slots: int, update_interval: int, seeds: list[int]) -> dict:
    """Bug and fix over ``seeds`` (request order and update phase): per seed the trained samples' mean length and
    reward, minus the policy's (all samples), the share of groups dropped, and the kept share per length."""
    lengths, rewards = pool["lengths"], pool["rewards"]
    true_length, true_reward = float(lengths.mean()), float(rewards.mean())
    out = {"true_length": true_length, "true_reward": true_reward, "update_interval": update_interval, "slots": slots,
           "seeds": list(seeds), "samples": lengths.numel()}
    for variant, abort in (("bug", True), ("fix", False)):
        runs = [simulate_engine(lengths, slots=slots, update_interval=update_interval, abort_on_update=abort, seed=s)
                for s in seeds]
        kept = torch.stack([r["kept"] for r in runs])  # seeds × groups × samples
        length_bias = [float(lengths[k].mean()) - true_length if k.any() else float("nan") for k in kept]
        reward_bias = [float(rewards[k].mean()) - true_reward if k.any() else float("nan") for k in kept]
        out[variant] = {
            "length_bias": length_bias, "reward_bias": reward_bias,
            "length_bias_mean": mean_and_se(length_bias)[0], "length_bias_se": mean_and_se(length_bias)[1],
            "reward_bias_mean": mean_and_se(reward_bias)[0], "reward_bias_se": mean_and_se(reward_bias)[1],
            "groups_dropped": float((~kept.all(-1)).float().mean()), "samples_kept": float(kept.float().mean()),
            "aborted_per_seed": sum(r["aborted"] for r in runs) / len(runs),
            "kept_by_length": _kept_by_length(lengths, kept),
        }
    return out


def _kept_by_length(lengths: torch.Tensor, kept: torch.Tensor) -> dict:
    """``{length: kept share over seeds}`` for each response length that occurs."""
    flat_lengths = lengths.expand_as(kept).reshape(-1)
    flat_kept = kept.reshape(-1).float()
    return {int(v): float(flat_kept[flat_lengths == v].mean()) for v in flat_lengths.unique()}


def interval_sweep(pool: dict, *, slots: int, update_intervals: list[int], seeds: list[int]) -> dict:
    """``abort_effects`` at each update interval: ``{interval: effects}``."""
    return {u: abort_effects(pool, slots=slots, update_interval=u, seeds=seeds) for u in update_intervals}


# ---- verdict ------------------------------------------------------------------------------------
def verdict(effects: dict, *, signature: float = 0.02, sigmas: float = 4.0) -> tuple[bool, bool]:
    """``(reproduced, fixed)``: aborting at updates shortens the trained samples by more than ``signature`` of the
    policy's mean length and by more than ``sigmas`` standard errors over seeds; resuming keeps every sample (no
    group dropped, length bias exactly 0)."""
    bug, fix = effects["bug"], effects["fix"]
    shortened = -bug["length_bias_mean"]
    reproduced = shortened > signature * effects["true_length"] and shortened > sigmas * bug["length_bias_se"]
    fixed = fix["groups_dropped"] == 0.0 and abs(fix["length_bias_mean"]) < 1e-9
    return reproduced, fixed


def not_shown(effects: dict) -> str | None:
    """Why this configuration could not show the bias (``None`` when ``verdict`` reproduced it)."""
    if verdict(effects)[0]:
        return None
    return (f"the policy's responses ({effects['true_length']:.1f} decode steps on average) are short against the update "
            f"interval of {effects['update_interval']} steps, so few are in flight at an update (trained mean shorter by "
            f"{-effects['bug']['length_bias_mean']:.2f} steps): lower update_interval or use a checkpoint with longer "
            "responses (tiny-sums-qwen2)")


# ---- figures ------------------------------------------------------------------------------------
def plot_kept_by_length(ax, effects: dict) -> None:
    """Share of samples reaching the trainer by response length: abort at update (bug) vs resume (fix), and the
    lone-request theory 1 − L / U."""
    for variant, color, marker in (("bug", plots.BUG_COLOR, "o-"), ("fix", plots.FIX_COLOR, "s--")):
        kept = effects[variant]["kept_by_length"]
        ax.plot(list(kept), list(kept.values()), marker, ms=3, color=color,
                label="aborted at update (bug)" if variant == "bug" else "resumed (fix)")
    x = torch.tensor(sorted(effects["bug"]["kept_by_length"]), dtype=torch.float)
    ax.plot(x.numpy(), survival_theory(x, effects["update_interval"]).numpy(), ":", color=plots.NEUTRAL_COLOR,
            label="1 − L/U (one request)")
    ax.set(xlabel="response length L (decode steps)", ylabel="share trained", ylim=(-0.03, 1.05))
    plots.legend_outside(ax, ncol=2)


def plot_interval_sweep(ax, sweep: dict) -> None:
    """Trained mean length minus the policy's, mean ± s.e. over seeds, by update interval."""
    intervals = sorted(sweep)
    for variant, color, marker in (("bug", plots.BUG_COLOR, "o-"), ("fix", plots.FIX_COLOR, "s--")):
        means = [sweep[u][variant]["length_bias_mean"] for u in intervals]
        ses = [sweep[u][variant]["length_bias_se"] for u in intervals]
        ax.errorbar(intervals, means, yerr=ses, fmt=marker, ms=3, color=color, capsize=3,
                    label="aborted (bug)" if variant == "bug" else "resumed (fix)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(intervals, [str(u) for u in intervals])
    ax.minorticks_off()
    ax.set(xlabel="update interval U (decode steps)", ylabel="trained − policy length")
    plots.legend_outside(ax, ncol=2)


def figure_abort_bias(effects: dict, sweep: dict):
    """The notebook's figure: kept share by length at the chosen interval (left), length bias by interval (right)."""
    return plots.figure_panels((9.6, 3.8), lambda ax: plot_kept_by_length(ax, effects), lambda ax: plot_interval_sweep(ax, sweep))


# ---- printers -----------------------------------------------------------------------------------
def pool_line(pool: dict) -> str:
    lengths = pool["lengths"]
    return (f"{lengths.numel()} responses ({lengths.shape[0]} groups of {pool['group_size']}): length {float(lengths.mean()):.1f} "
            f"(range {int(lengths.min())}–{int(lengths.max())}) decode steps, reward {float(pool['rewards'].mean()):.3f}, "
            f"corr(length, reward) {pool['length_reward_corr']:+.2f}")


def effects_lines(effects: dict) -> str:
    lines = [f"update every {effects['update_interval']} steps, {effects['slots']} slots, seeds {effects['seeds']}:"]
    for variant in ("bug", "fix"):
        v = effects[variant]
        lines.append(f"  {'aborted at update (bug)' if variant == 'bug' else 'resumed (fix)':>24}: {v['aborted_per_seed']:.0f} "
                     f"aborts, {v['groups_dropped']:.0%} of groups dropped; trained length {v['length_bias_mean']:+.2f} ± "
                     f"{v['length_bias_se']:.2f} steps vs the policy's {effects['true_length']:.1f}; reward "
                     f"{v['reward_bias_mean']:+.3f} ± {v['reward_bias_se']:.3f} vs {effects['true_reward']:.3f}")
    return "\n".join(lines)


def reward_sentence(effects: dict, pool: dict, sigmas: float = 2.0) -> str:
    """Whether the trained reward's bias at the headline interval stands out of its seed noise (``sigmas`` s.e.)."""
    bug = effects["bug"]
    beyond = abs(bug["reward_bias_mean"]) > sigmas * bug["reward_bias_se"]
    verdict_text = (f"beyond {sigmas:g} s.e.: the logged reward is biased {'up' if bug['reward_bias_mean'] > 0 else 'down'}"
                    if beyond else f"within {sigmas:g} s.e. of 0: no reward bias shown at this interval")
    return (f"corr(length, reward) of the policy's responses {pool['length_reward_corr']:+.2f}; the trained reward's bias "
            f"{bug['reward_bias_mean']:+.3f} ± {bug['reward_bias_se']:.3f} is {verdict_text}")


def sweep_lines(sweep: dict) -> str:
    return "\n".join(f"U = {u:>4}: trained length {s['bug']['length_bias_mean']:+.2f} ± {s['bug']['length_bias_se']:.2f} (bug), "
                     f"{s['fix']['length_bias_mean']:+.2f} (fix); groups dropped {s['bug']['groups_dropped']:.0%}"
                     for u, s in sorted(sweep.items()))


# ---- explorer -----------------------------------------------------------------------------------
def interval_explorer(pool: dict, *, slots: int, seeds: list[int]) -> Explorer:
    """P43: the kept share by length as the update interval and the engine's slots change."""

    def draw(update_interval, engine_slots):
        fig, ax = plt.subplots(figsize=(9, 3.6))
        effects = abort_effects(pool, slots=engine_slots, update_interval=update_interval, seeds=seeds)
        plot_kept_by_length(ax, effects)
        return {"update_interval": update_interval, "slots": engine_slots,
                "length_bias_bug": effects["bug"]["length_bias_mean"], "length_bias_fix": effects["fix"]["length_bias_mean"]}

    controls = {"update_interval": widgets.IntSlider(value=64, min=16, max=512, step=16, description="update U"),
                "engine_slots": widgets.IntSlider(value=slots, min=4, max=128, step=4, description="slots")}
    return Explorer(controls, draw, "P43: requests aborted at each weight update")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(effects: dict, sweep: dict, pool: dict) -> dict:
    """Notebook 43's ``notebook_api.write_metrics`` keyword arguments."""
    reproduced, fixed = verdict(effects)
    compact = {k: v for k, v in effects.items() if k not in ("bug", "fix")}
    for variant in ("bug", "fix"):
        compact[variant] = {k: v for k, v in effects[variant].items() if k != "kept_by_length"}
    return {
        "notebook": "43_aborted_requests_bias", "reproduced": reproduced, "fixed": fixed, "not_shown": not_shown(effects),
        "metrics": {**compact, "length_reward_corr": pool["length_reward_corr"],
                    "sweep": {str(u): {v: s[v]["length_bias_mean"] for v in ("bug", "fix")} for u, s in sweep.items()}},
        "headline": {"what": "trained mean response length minus the policy's", "unit": "decode steps",
                     "bug": effects["bug"]["length_bias_mean"], "fix": effects["fix"]["length_bias_mean"]},
    }
