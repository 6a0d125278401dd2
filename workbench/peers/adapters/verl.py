"""verl 0.9.1 ``verl.trainer.ppo.core_algos``, probed by calling its functions on crafted tensors.

* ``aggregation`` — ``workbench.audit.check_aggregation`` on ``agg_loss`` for each ``loss_agg_mode``
  (the constant of ``seq-mean-token-sum-norm`` is recovered by the check);
* ``grpo_advantage`` — ``compute_grpo_outcome_advantage`` on groups whose answer tells the std
  (rewards [1, 0, 0, 0]: Bessel std 0.5 vs biased 0.433) and the ε (rewards [0, 1e-5]: A depends
  on ε at the 1e-6 scale), a constant group, and ``norm_adv_by_std_in_grpo=False``;
* ``kl_penalty`` — every estimator on a grid of log-ratios r = log π − log π_ref in [−30, 30]:
  the formula it matches (k1, |r|, k2, k3) and where it is clamped;
* ``dual_clip`` — ``compute_policy_loss`` per-token loss for A = ±1 over ratios 0.1…100 and a
  log-ratio of 30 (the clamp of the log-ratio shows in ``ppo_kl``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from workbench.audit import check_aggregation
from workbench.peers import protocol

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def import_peer():
    from verl.trainer.ppo import core_algos  # noqa: F401


def aggregation_rows() -> list[dict]:
    from verl.trainer.ppo.core_algos import agg_loss  # verl: its peer environment only


    rows = []
    for mode in AGG_MODES:
        result = check_aggregation(lambda values, mask, m=mode: agg_loss(values, mask, m), expected=mode)
        rows.append(protocol.audit_row("aggregation", result, loss_agg_mode=mode, mode=result.details["mode"],
                                       norm_constant=result.details.get("norm_constant"),
                                       scaling=result.details.get("norm_constant_scaling")))
    return rows


def grpo_advantage(rewards, norm=True, epsilon=None):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # verl: its peer environment only

    n = len(rewards)
    scores = torch.zeros(n, 3)
    scores[:, -1] = torch.tensor(rewards, dtype=torch.float32)
    kwargs = {} if epsilon is None else {"epsilon": epsilon}
    adv, _ = compute_grpo_outcome_advantage(scores, torch.ones(n, 3), np.array(["g"] * n, dtype=object),
                                            norm_adv_by_std_in_grpo=norm, **kwargs)
    return adv[:, -1].double()


def advantage_row() -> dict:
    rewards = [1.0, 0.0, 0.0, 0.0]
    a = grpo_advantage(rewards)
    denominator = 0.75 / float(a[0])  # (1 − mean) / A_1 = std + ε
    bessel, biased = float(np.std(rewards, ddof=1)), float(np.std(rewards, ddof=0))
    delta = 1e-5
    b = grpo_advantage([0.0, delta])
    std_small = float(torch.tensor([0.0, delta]).std())
    epsilon = (delta / 2) / float(b[1]) - std_small
    constant = grpo_advantage([0.7] * 4)
    unscaled = grpo_advantage(rewards, norm=False)
    return protocol.audit_row(
        "grpo_advantage", None, rewards=rewards, advantages=a.tolist(), std_plus_eps=denominator,
        bessel_std=bessel, biased_std=biased,
        std="Bessel (n-1)" if abs(denominator - bessel) < 1e-4 else
            ("biased (n)" if abs(denominator - biased) < 1e-4 else "other"),
        epsilon=epsilon, constant_group_advantages=constant.tolist(), unscaled_advantages=unscaled.tolist())


def kl_row() -> dict:
    from verl.trainer.ppo.core_algos import kl_penalty  # verl: its peer environment only

    r = torch.linspace(-30, 30, 241, dtype=torch.float32)
    logprob, ref = r.clone(), torch.zeros_like(r)
    forms = {"k1": r, "abs": r.abs(), "k2": 0.5 * r.square(), "k3": torch.expm1(-r.double()).float() + r}
    kinds = {}
    for kind in KL_KINDS:
        value = kl_penalty(logprob, ref, kind)
        inside = r.abs() <= 2
        matches = [name for name, f in forms.items() if torch.allclose(value[inside], f[inside], rtol=1e-4, atol=1e-5)]
        formula = forms[matches[0]] if matches else None
        clamped = formula is not None and not torch.allclose(value, formula, rtol=1e-4, atol=1e-5)
        kinds[kind] = {"formula": matches[0] if matches else "unknown", "clamped": bool(clamped),
                       "max": float(value.max()), "min": float(value.min()),
                       "value_at_r_-15": float(kl_penalty(torch.tensor([-15.0]), torch.tensor([0.0]), kind)[0]),
                       "value_at_r_-25": float(kl_penalty(torch.tensor([-25.0]), torch.tensor([0.0]), kind)[0])}
    return protocol.audit_row("kl_penalty", None, kinds=kinds, grid=[-30, 30])


def dual_clip_row() -> dict:
    from verl.trainer.ppo.core_algos import compute_policy_loss  # verl: its peer environment only

    ratios = [0.1, 0.5, 0.8, 1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 10.0, 100.0]
    curves = {}
    for sign in (1.0, -1.0):
        losses = []
        for rho in ratios:
            lp = torch.tensor([[math.log(rho)]])
            loss = compute_policy_loss(torch.zeros(1, 1), lp, torch.tensor([[sign]]), torch.ones(1, 1), cliprange=0.2)[0]
            losses.append(float(loss))
        curves["A=+1" if sign > 0 else "A=-1"] = losses
    _, _, ppo_kl, _ = compute_policy_loss(torch.zeros(1, 1), torch.tensor([[30.0]]), torch.tensor([[1.0]]), torch.ones(1, 1),
                                          cliprange=0.2)
    negative = curves["A=-1"]
    return protocol.audit_row("dual_clip", None, ratios=ratios, losses=curves, loss_cap_negative_advantage=max(negative),
                              dual_clip=max(negative) < ratios[-1] - 1e-6, ppo_kl_at_log_ratio_30=float(ppo_kl),
                              log_ratio_clamp=abs(float(ppo_kl)))


def probes(args) -> list[dict]:
    warnings.filterwarnings("ignore")
    return aggregation_rows() + [advantage_row(), kl_row(), dual_clip_row()]


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["verl", "transformers", "ray", "tensordict"])
