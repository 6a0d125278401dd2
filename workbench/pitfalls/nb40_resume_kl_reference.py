"""Pitfall P40: resuming re-anchors the KL reference — captured after the checkpoint loads, it is the resumed policy.

A KL penalty ties the policy to a reference, normally the initial policy π_0: the penalty β·KL(π_θ ‖ π_ref) is a
budget on how far training may move. Trainers that build the reference by copying the policy model at start-up must
do so *before* a resume checkpoint is loaded into it. NeMo-RL's DTensor v2 worker snapshotted the reference after
``setup_model_and_optimizer()``, which since its init refactor applied the resume checkpoint inside: each restart reset
the reference to the resumed policy, so ``train/kl_penalty`` dropped to 0 at every resume (NeMo-RL issue #2955, fix
PR #3722 "keep the KL reference anchored to base weights across resumes", 2026, deferring the checkpoint load until the
reference is captured). slime's resumed runs had the mirror problem (slime #1695): the single Megatron model held the
reference weights after ``ref_load`` and the first sync served them. Nothing fails: the KL curve looks healthy between
resumes, and each resume quietly grants a fresh KL budget.

This module trains the tiny model with REINFORCE and a k3 KL penalty to the reference, and restarts the run at chosen
steps from an exact checkpoint (policy and optimizer state): ``reference_from="resumed"`` (bug) copies the policy after
the load, ``"initial"`` (fix) rebuilds it from the initial weights (or loads a saved reference). Both variants share
every step before the first resume bit for bit. Recorded per step: the KL the loss sees (to the reference) and the KL
to the initial policy, both k3 estimates on the policy's own samples.
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

REFERENCES = ("resumed", "initial")  # the bug, the fix


# ---- measurements --------------------------------------------------------------------------------
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ ref) on π's samples: exp(r) − 1 − r, r = log ref − log π (≥ 0)."""
    ratio = ref_logp - logp
    return ratio.exp() - 1 - ratio


def resume(model, checkpoint: dict, *, lr: float, reference_from: str, initial):
    """A restarted process: a fresh model from ``initial``'s weights, the checkpoint's policy and optimizer state loaded,
    and the reference built — after the load from the policy (``"resumed"``, the bug) or from ``initial`` (the fix)."""
    if reference_from not in REFERENCES:
        raise ValueError(f"reference_from={reference_from!r}; use one of {REFERENCES} ('initial' is the fix)")
    policy = copy.deepcopy(initial)
    policy.load_state_dict(checkpoint["policy"])
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    optimizer.load_state_dict(checkpoint["optimizer"])
    reference = copy.deepcopy(policy if reference_from == "resumed" else initial).requires_grad_(False)
    return policy, optimizer, reference


def checkpoint_of(policy, optimizer) -> dict:
    return {"policy": copy.deepcopy(policy.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}


def train_step(step: int, policy, optimizer, reference, initial, tokenizer, problems, *, beta: float, seed: int,
               batch_size: int) -> dict:
    """One REINFORCE step with a k3 KL penalty to ``reference``, sampled by the policy; the record holds the KL to the
    reference (what the loss sees) and to ``initial``, token means, before the update."""
    order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(seed)).tolist()
    picked = [problems[order[(step * batch_size + i) % len(order)]] for i in range(batch_size)]
    batch = ws.rollout_batch(policy, tokenizer, picked, seed=seed * 100_003 + step)
    r = batch["rollout"]
    mask = r.response_mask.float()
    logp = ws.scored(policy, r)
    with torch.no_grad():
        ref_logp, init_logp = ws.scored(reference, r), ws.scored(initial, r)
    kl = (k3(logp, ref_logp) * mask).sum() / mask.sum()
    advantage = batch["rewards"] - batch["rewards"].mean()
    loss = -(advantage * (logp * mask).sum(-1)).mean() + beta * kl
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    kl_initial = (k3(logp.detach(), init_logp) * mask).sum() / mask.sum()
    return {"step": step, "kl_reference": float(kl.detach()), "kl_initial": float(kl_initial), "reward": float(batch["rewards"].mean()),
            "reward_spread": float(batch["rewards"].std())}


# ---- sweeps --------------------------------------------------------------------------------------
def resumed_runs(model, tokenizer, problems, *, steps: int, resumes: list[int], seeds: list[int], beta: float = 0.2,
                 lr: float = 1e-3, batch_size: int = 8) -> dict:
    """``{reference_from: [history per seed]}``: ``steps`` steps restarted at each step in ``resumes`` from an exact
    checkpoint; the steps before the first resume run once and are shared by both variants."""
    if any(not 0 < s < steps for s in resumes):
        raise ValueError(f"resumes={resumes}: each resume must fall inside the run (0 < step < steps={steps})")
    resumes = sorted(resumes)
    runs = {ref: [] for ref in REFERENCES}
    for seed in progress.track(seeds, "seeds", unit="seed"):
        policy = copy.deepcopy(model)
        optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
        reference = copy.deepcopy(model).requires_grad_(False)
        shared = [train_step(t, policy, optimizer, reference, model, tokenizer, problems, beta=beta, seed=seed,
                             batch_size=batch_size) for t in range(resumes[0])]
        start = checkpoint_of(policy, optimizer)
        for ref in REFERENCES:
            history, checkpoint = [dict(h) for h in shared], start
            for t in range(resumes[0], steps):
                if t in resumes:
                    policy, optimizer, reference = resume(model, checkpoint, lr=lr, reference_from=ref, initial=model)
                history.append(train_step(t, policy, optimizer, reference, model, tokenizer, problems, beta=beta, seed=seed,
                                          batch_size=batch_size))
                checkpoint = checkpoint_of(policy, optimizer) if t + 1 in resumes else checkpoint
            runs[ref].append(history)
    return {"runs": runs, "resumes": resumes, "seeds": list(seeds), "steps": steps, "beta": beta}


def at_resumes(result: dict, ref: str, key: str) -> list[float]:
    """``key`` at the resume steps, every seed."""
    return [h[key] for run in result["runs"][ref] for h in run if h["step"] in result["resumes"]]


def kl_effect(result: dict) -> statistics.Effect:
    """bug − fix of the KL to the initial policy over the last quarter of the steps, paired by seed."""
    return statistics.effect({"bug": result["runs"]["resumed"], "fix": result["runs"]["initial"]}, "kl_initial", "bug", "fix")


def headline_row(result: dict) -> dict:
    """The KL the loss sees at the resumes (bug: reset to 0) against the KL to π_0 there, and the end-of-run effect."""
    e = kl_effect(result)
    return {"bug_kl_seen_at_resume": max(at_resumes(result, "resumed", "kl_reference")),
            "kl_initial_at_resume": float(np.mean(at_resumes(result, "resumed", "kl_initial"))),
            "fix_mismatch": max(abs(h["kl_reference"] - h["kl_initial"]) for run in result["runs"]["initial"] for h in run),
            "bug": e.bug, "fix": e.fix, "effect": e.difference, "se": e.noise, "mde": e.mde, "seeds": e.seeds}


# ---- verdict -------------------------------------------------------------------------------------
PREDICTION = statistics.Prediction("kl_initial", "k3 KL to the initial policy over the last quarter of the steps", "+", "nats/token")


def verdict(result: dict, *, kl_threshold: float = 1e-3, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed).

    Reproduced: at every resume the bug's loss sees a KL ≤ ``tolerance`` (the reference is the policy) while the policy
    is more than ``kl_threshold`` from π_0 on average. Fixed: the fix's loss sees the KL to π_0 at every step
    (|KL to reference − KL to π_0| ≤ ``tolerance``).
    """
    head = headline_row(result)
    reproduced = head["bug_kl_seen_at_resume"] <= tolerance and head["kl_initial_at_resume"] > kl_threshold
    return reproduced, head["fix_mismatch"] <= tolerance


def not_shown(result: dict, *, kl_threshold: float = 1e-3) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: a policy still at π_0 when the run resumes loses no KL
    budget by re-anchoring."""
    head = headline_row(result)
    if head["kl_initial_at_resume"] > kl_threshold:
        return None
    return ws.no_update_reason(list(result["runs"].values())) or (
        f"the policy was only {head['kl_initial_at_resume']:.1e} nats/token from π_0 at the resumes (threshold "
        f"{kl_threshold:g}): re-anchoring there loses nothing visible; resume later or raise the learning rate")


# ---- figures -------------------------------------------------------------------------------------
LABELS = {"resumed": "bug: reference copied after the load", "initial": "fix: reference from π_0"}


def _mark_resumes(ax, result: dict) -> None:
    for i, step in enumerate(result["resumes"]):
        ax.axvline(step - 0.5, color=plots.NEUTRAL_COLOR, ls=":", lw=1, label="resume" if i == 0 else None)


def plot_kl(ax, result: dict, key: str, title: str) -> None:
    """``key`` over steps, bug and fix, ± std over seeds, the resumes dotted."""
    runs = {LABELS[ref]: result["runs"][ref] for ref in REFERENCES}
    plots.plot_bands(ax, runs, key, "k3 KL, nats/token", plots.bug_fix_colors(list(runs)))
    _mark_resumes(ax, result)
    ax.set_title(title, fontsize=10)


def figure_resume_kl(result: dict):
    """The notebook's figure: the KL the loss sees (left) and the KL to π_0 (right) over a run resumed twice."""
    fig, axes = plots.panel_grid(2, panel_height=3.4)
    plot_kl(axes[0], result, "kl_reference", "KL to the reference (the loss)")
    plot_kl(axes[1], result, "kl_initial", "KL to the initial policy")
    plots.figure_legend(fig, axes[0], ncol=3)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def resume_lines(result: dict) -> str:
    """Per resume: the KL the bug's loss sees and the KL to π_0, seed means."""
    lines = []
    for step in result["resumes"]:
        rows = [h for run in result["runs"]["resumed"] for h in run if h["step"] == step]
        before = [h for run in result["runs"]["resumed"] for h in run if h["step"] == step - 1]
        lines.append(f"resume at step {step}: the bug's loss sees KL {np.mean([h['kl_reference'] for h in rows]):.2e} (step "
                     f"{step - 1}: {np.mean([h['kl_reference'] for h in before]):.2e}); KL to π_0 "
                     f"{np.mean([h['kl_initial'] for h in rows]):.2e} nats/token")
    return "\n".join(lines)


def resume_note(result: dict) -> str:
    return (f"k3 estimates of KL(π_θ ‖ ·) per response token on the policy's own samples, before each step's update; β = "
            f"{result['beta']:g}; dotted lines: the run restarts from an exact checkpoint (policy and optimizer) at steps "
            f"{result['resumes']}; the two variants share every step before the first resume. Left: to the reference the "
            "loss penalises; right: to the initial policy π_0.")


def headline_sentence(result: dict) -> str:
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    if not reproduced:
        return f"not reproduced: {not_shown(result) or 'see the verdict'}"
    return (f"at each resume the bug's loss saw a KL of {head['bug_kl_seen_at_resume']:.0e} while the policy was "
            f"{head['kl_initial_at_resume']:.3f} nats/token from π_0; over the last quarter the KL to π_0 is {head['bug']:.3f} "
            f"(bug) vs {head['fix']:.3f} (fix), bug − fix {head['effect']:+.3f} ± {head['se']:.2g} s.e. over seeds "
            f"{result['seeds']} (MDE {head['mde']:.2g}); the fix's loss sees the KL to π_0 "
            + ("exactly" if head["fix_mismatch"] == 0 else f"to {head['fix_mismatch']:.0e}")
            + (" (fixed)." if fixed else " — not fixed."))


# ---- explorer ------------------------------------------------------------------------------------
def resume_explorer(result: dict) -> Explorer:
    """Pick a seed and a measure: bug and fix over steps for that seed, resumes dotted, redrawn."""

    def draw(seed, measure):
        index = result["seeds"].index(seed)
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        for ref in REFERENCES:
            run = result["runs"][ref][index]
            ax.plot([h["step"] for h in run], [h[measure] for h in run], "o-", markersize=3, label=LABELS[ref],
                    color=plots.BUG_COLOR if ref == "resumed" else plots.FIX_COLOR)
        _mark_resumes(ax, result)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"{measure}, nats/token")
        ax.legend(fontsize=8)
        last = result["runs"]["resumed"][index][-1][measure]
        ax.set_title(f"seed {seed}: bug's last {measure} {last:.3f}", fontsize=9)
        return {"seed": seed, "measure": measure, "bug_last": last}

    return Explorer({"seed": widgets.Dropdown(options=result["seeds"], value=result["seeds"][0], description="seed"),
                     "measure": widgets.Dropdown(options=["kl_reference", "kl_initial", "reward"], value="kl_reference",
                                                 description="measure")},
                    draw, title="P40: the KL reference across resumes")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(result: dict, task: str = "arith") -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 40."""
    reproduced, fixed = verdict(result)
    head = headline_row(result)
    return dict(
        notebook="40_resume_kl_reference", reproduced=reproduced, fixed=fixed, not_shown=not_shown(result),
        metrics={"seeds": result["seeds"], "steps": result["steps"], "resumes": result["resumes"], "beta": result["beta"],
                 **{k: head[k] for k in ("bug_kl_seen_at_resume", "kl_initial_at_resume", "fix_mismatch")},
                 "kl_initial_effect": vars(kl_effect(result)),
                 "prediction": PREDICTION.record({"kl_initial": kl_effect(result)}, task),
                 "kl_by_step": {f"{ref}_{key}": np.mean([[h[key] for h in run] for run in runs], axis=0).tolist()
                                for ref, runs in result["runs"].items() for key in ("kl_reference", "kl_initial")}},
        headline={"what": f"KL the loss sees at the resumes (steps {result['resumes']}) while the policy is "
                          f"{head['kl_initial_at_resume']:.3f} nats/token from π_0", "unit": "nats/token (k3)",
                  "bug": head["bug_kl_seen_at_resume"], "fix": float(np.mean(at_resumes(result, "initial", "kl_reference")))},
    )
