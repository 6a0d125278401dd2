"""What the inspector looks for in a dump, one check per class: each takes responses one at a time (``add``), keeps
sufficient statistics (sums per step and group, counts, bounded arrays), and gives its findings at the end
(``findings``) and the numbers a logger can plot (``scalars``).

Each finding names the catalogue's pitfall (``NOTEBOOKS``: its notebook) and carries the numbers that decided it.
Thresholds are constants here, so a reader can see what "large" means:

* ``Mismatch`` — P12 (training–inference gap, verl's ``rollout_corr/`` metrics) and P37 (a gap growing over steps);
* ``Truncation`` — S3 (responses without a stop, responses that go on after their EOS), P11 (truncated responses
  scored like finished ones);
* ``Tokens`` — P8 (the EOS that ends responses masked out of the loss), P21 (two BOS), S4 (prompt tokens trained);
* ``Groups`` — P16 (groups without reward signal; near-zero group std that a ``std != 0`` filter lets through);
* ``Staleness`` — P28 (samples from a policy older than the step that trains on them).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from workbench.inspect.gaps import GapProfile, GapSums, trend
from workbench.inspect.records import Rollout
from workbench.watch.report import Finding

NOTEBOOKS = {
    "S3": "notebooks/03_eos_termination.ipynb", "S4": "notebooks/04_dpo_loss_mask.ipynb",
    "P6": "notebooks/06_temperature.ipynb", "P8": "notebooks/08_pad_equals_eos.ipynb",
    "P11": "notebooks/11_truncated_responses.ipynb", "P12": "notebooks/12_logprob_mismatch.ipynb",
    "P16": "notebooks/16_group_statistics.ipynb", "P21": "notebooks/21_duplicate_bos.ipynb",
    "P28": "notebooks/28_async_staleness.ipynb", "P37": "notebooks/37_lora_sync.ipynb",
}
K3_INFO, K3_WARNING, K3_ERROR = 1e-4, 1e-3, 1e-2  # rollout_corr/k3_kl over the dump: a bf16 sampler and an fp32
# trainer sit near 1e-4..1e-3 (info), one sampler's weights behind at 1e-3..1e-2 (warning)
GROWTH_STEPS, GROWTH_CORRELATION, GROWTH_RATIO, GROWTH_FLOOR = 3, 0.8, 3.0, 1e-3  # P37: steps, rank correlation,
# the last third's mean k3 over the first third's, the last step's k3
LENGTH_SHARE_WARNING = 0.5  # S3: share of responses ending without a stop
CONTINUED_SHARE_ERROR = 0.01  # S3: share of responses trained past their first EOS
EOS_SHARE = 0.5  # the final token of at least this share of stopped responses is taken for the EOS
MASKED_EOS_SHARE = 0.5  # P8: share of stopped responses whose final token is masked out
NEAR_ZERO_STD = 1e-6  # P16: 0 < group std (population) ≤ this × max(1, |mean|): rounding residue, not signal
NO_SIGNAL_SHARE_WARNING = 0.5  # P16: share of groups with all rewards equal


def finding(pitfall: str, severity: str, message: str, evidence: dict, where: str = "dump") -> Finding:
    return Finding(pitfall, severity, f"{message} (see {NOTEBOOKS[pitfall]})", evidence, where)


def decisive(tokens: Counter) -> int | None:
    """The token counted at least ``EOS_SHARE`` of the times: the EOS from stopped responses' final tokens, the BOS
    from prompts' first tokens; None when no token is (an engine that strips the stop token leaves no EOS to see)."""
    if not tokens:
        return None
    token, count = tokens.most_common(1)[0]
    return token if count >= EOS_SHARE * sum(tokens.values()) else None


class Mismatch:
    """P12 and P37 from responses carrying both the rollout's and the trainer's log-probs."""

    def __init__(self):
        self.total, self.steps, self.profile = GapSums(), {}, GapProfile()
        self.nan_tokens, self.worst = 0, (0.0, "?")
        self.lags: dict[int, int] = {}  # step → the largest policy_version lag of its responses, where recorded

    def add(self, rollout: Rollout) -> None:
        if rollout.rollout_logprobs is None or rollout.trainer_logprobs is None:
            return
        keep = rollout.mask()
        train, sampled = rollout.trainer_logprobs[keep], rollout.rollout_logprobs[keep]
        finite = np.isfinite(train) & np.isfinite(sampled)
        if not finite.all():  # verl refuses NaN; here those tokens are counted and left out
            self.nan_tokens += int((~finite).sum())
            train, sampled, keep = train[finite], sampled[finite], keep.copy()
            keep[np.flatnonzero(keep)[~finite]] = False
        self.steps.setdefault(rollout.step, GapSums()).add(train, sampled)
        if rollout.policy_version is not None:
            lag = rollout.step - rollout.policy_version
            self.lags[rollout.step] = max(self.lags.get(rollout.step, lag), lag)
        log_ratio = self.total.add(train, sampled)
        gap = np.abs(log_ratio)
        self.profile.add(np.flatnonzero(keep), rollout.response_ids[keep], gap)
        if len(gap) and gap.max() > self.worst[0]:
            self.worst = (float(gap.max()), rollout.where)

    def scalars(self) -> dict[str, float]:
        return self.total.metrics()

    def per_step(self) -> dict[int, dict[str, float]]:
        return {step: sums.metrics() for step, sums in sorted(self.steps.items())}

    def findings(self) -> list[Finding]:
        metrics = self.total.metrics()
        if not metrics:
            return []
        out = []
        k3 = metrics["rollout_corr/k3_kl"]
        evidence = {name.removeprefix("rollout_corr/"): value for name, value in metrics.items()}
        evidence |= {"tokens": self.total.tokens, "responses": self.total.rows, "nan_tokens": self.nan_tokens,
                     "top_tokens": self.profile.top_tokens(), "largest_abs_log_ratio": self.worst[0]}
        if k3 >= K3_INFO:
            severity = "error" if k3 >= K3_ERROR else "warning" if k3 >= K3_WARNING else "info"
            bound = {"error": K3_ERROR, "warning": K3_WARNING, "info": K3_INFO}[severity]
            positions = self.profile.by_position()
            evidence["by_position"] = positions
            out.append(finding("P12", severity, f"the trainer's log-probs differ from the sampler's: k3 KL {k3:.3g} per token "
                               f"(≥ {bound:g}); the largest gaps sit on token ids "
                               + ", ".join(str(t["token_id"]) for t in evidence["top_tokens"][:3])
                               + " (special tokens often do)", evidence, where=self.worst[1]))
        steps = sorted(self.steps)
        if self.lags:  # a gap that grows while the sampler's lag does is staleness ramping up (P28): only the steps at
            steady = self.lags.get(steps[-1])  # the last step's lag can show a gap that grows by itself
            steps = [step for step in steps if self.lags.get(step) == steady]
        values = [self.steps[step].metrics()["rollout_corr/k3_kl"] for step in steps]
        shape = trend(steps, values)
        if (shape["steps"] >= GROWTH_STEPS and shape["rank_correlation"] >= GROWTH_CORRELATION and shape["growth"] >= GROWTH_RATIO
                and values[-1] >= GROWTH_FLOOR):
            out.append(finding("P37", "error", f"the gap grows with training: k3 KL {values[0]:.3g} at step {steps[0]} to "
                               f"{values[-1]:.3g} at step {steps[-1]} (rank correlation {shape['rank_correlation']:.2f}, "
                               f"×{shape['growth']:.3g}): weights that never reach the sampler, e.g. a LoRA adapter left out "
                               "of the weight sync (verl #7495)", shape | {"k3_kl_by_step": dict(zip(steps, values, strict=True))}))
        return out


class Truncation:
    """S3 and P11 from ``finish`` and the token ids."""

    def __init__(self, eos_token_id: int | None = None, fallback_eos: int | None = None):
        self.eos_token_id, self.fallback_eos = eos_token_id, fallback_eos  # given; the model's, when none can be seen
        self.finished = Counter()
        self.last_tokens = Counter()  # final token of "stop" responses: the EOS, unless given
        self.continued = np.zeros(0, dtype=np.int64)  # per token id: responses with a trained token after it
        self.length_rewards = [0, 0.0, math.inf, -math.inf]  # count, sum, min, max of truncated responses' rewards
        self.stop_rewards = [0, 0.0, math.inf, -math.inf]
        self.responses, self.example = 0, {}

    def add(self, rollout: Rollout) -> None:
        if rollout.response_ids is None:
            return
        self.responses += 1
        ids = rollout.response_ids
        if rollout.finish is not None:
            self.finished[rollout.finish] += 1
            self.example.setdefault(rollout.finish, rollout.where)
            if rollout.finish == "stop" and len(ids):
                self.last_tokens[int(ids[-1])] += 1
            if rollout.reward is not None and rollout.finish in ("stop", "length") and rollout.mask().any():
                sums = self.length_rewards if rollout.finish == "length" else self.stop_rewards
                sums[0] += 1
                sums[1] += rollout.reward
                sums[2], sums[3] = min(sums[2], rollout.reward), max(sums[3], rollout.reward)
        trained = np.flatnonzero(rollout.mask())
        if len(trained) > 1:  # every id before the last trained token is followed by a trained token
            before = np.unique(ids[: trained[-1]])
            before = before[before >= 0]
            if len(before) and before[-1] >= len(self.continued):
                self.continued = np.concatenate([self.continued, np.zeros(int(before[-1]) + 1 - len(self.continued), np.int64)])
            self.continued[before] += 1
            eos = self.eos_token_id if self.eos_token_id is not None else decisive(self.last_tokens)
            if eos is not None and "continued" not in self.example and eos in before:
                self.example["continued"] = rollout.where

    def eos(self) -> int | None:
        if self.eos_token_id is not None:
            return self.eos_token_id
        seen = decisive(self.last_tokens)
        return seen if seen is not None else self.fallback_eos

    def scalars(self) -> dict[str, float]:
        told = sum(self.finished.values())
        return {f"inspect/finish_{reason}_share": count / told for reason, count in self.finished.items()} if told else {}

    def findings(self) -> list[Finding]:
        out, told = [], sum(self.finished.values())
        length = self.finished.get("length", 0)
        eos = self.eos()
        if told and length / told >= LENGTH_SHARE_WARNING:
            out.append(finding("S3", "warning", f"{length / told:.0%} of responses ended without a stop (finish 'length'): no EOS "
                               "reached before max_new_tokens — is the sampler's stop token set?",
                               {"length_share": length / told, "responses": told, "eos_token_id": eos},
                               self.example.get("length", "dump")))
        continued = int(self.continued[eos]) if eos is not None and 0 <= eos < len(self.continued) else 0
        if self.responses and continued / self.responses >= CONTINUED_SHARE_ERROR:
            out.append(finding("S3", "error", f"{continued} responses ({continued / self.responses:.1%}) go on after their first "
                               f"EOS (id {eos}) with trained tokens: mask everything after the first EOS",
                               {"continued": continued, "continued_share": continued / self.responses, "eos_token_id": eos},
                               self.example.get("continued", "dump")))
        count, total, low, high = self.length_rewards
        if count and high > self.stop_rewards[2]:  # a truncated response got more than the worst finished one
            stop_mean = self.stop_rewards[1] / self.stop_rewards[0] if self.stop_rewards[0] else math.nan
            out.append(finding("P11", "warning", f"{count} truncated responses were scored like finished ones: their rewards "
                               f"range {low:.3g}..{high:.3g} (mean {total / count:.3g}), above the lowest finished reward "
                               f"{self.stop_rewards[2]:.3g} (finished mean {stop_mean:.3g}); give a truncated response a fixed "
                               "penalty or mask it",
                               {"truncated": count, "truncated_share": length / told, "truncated_reward_mean": total / count,
                                "truncated_reward_min": low, "truncated_reward_max": high, "finished_reward_mean": stop_mean,
                                "finished_reward_min": self.stop_rewards[2]}, self.example.get("length", "dump")))
        return out


class Tokens:
    """P8, P21 and S4 from the token ids and the loss mask."""

    def __init__(self):
        self.first_tokens, self.double_first = Counter(), Counter()
        self.stop_last, self.stop_last_masked = Counter(), Counter()
        self.prompt_trained_rows = self.prompt_trained_tokens = self.prompts = 0
        self.example = {}

    def add(self, rollout: Rollout) -> None:
        prompt = rollout.prompt_ids
        if prompt is not None and len(prompt):
            self.prompts += 1
            self.first_tokens[int(prompt[0])] += 1
            if len(prompt) > 1 and prompt[0] == prompt[1]:
                self.double_first[int(prompt[0])] += 1
                self.example.setdefault("P21", rollout.where)
        if rollout.prompt_masked_in:
            self.prompt_trained_rows += 1
            self.prompt_trained_tokens += rollout.prompt_masked_in
            self.example.setdefault("S4", rollout.where)
        if rollout.finish == "stop" and rollout.response_length:
            last = int(rollout.response_ids[-1])
            self.stop_last[last] += 1
            if not rollout.mask()[-1]:
                self.stop_last_masked[last] += 1
                self.example.setdefault("P8", rollout.where)

    def findings(self) -> list[Finding]:
        out = []
        if (eos := decisive(self.stop_last)) is not None:
            stopped = self.stop_last[eos]
            masked = self.stop_last_masked.get(eos, 0)
            if masked / stopped >= MASKED_EOS_SHARE:
                out.append(finding("P8", "error", f"the EOS (id {eos}) that ends {stopped} stopped responses is masked out of "
                                   f"the loss in {masked / stopped:.0%} of them — the signature of pad = EOS with pads masked: "
                                   "the model never learns to stop", {"eos_token_id": eos, "stopped": stopped,
                                                                      "eos_masked": masked, "eos_masked_share": masked / stopped},
                                   self.example.get("P8", "dump")))
        if (bos := decisive(self.first_tokens)) is not None:  # most prompts open with it: the BOS
            doubled = self.double_first.get(bos, 0)
            if doubled:
                share = doubled / self.prompts
                out.append(finding("P21", "error" if share >= 0.5 else "warning",
                                   f"{doubled} prompts ({share:.0%}) start with token {bos} twice: a chat template that adds "
                                   "BOS on top of the tokenizer's", {"bos_token_id": bos, "double_bos": doubled,
                                                                    "double_bos_share": share, "prompts": self.prompts},
                                   self.example.get("P21", "dump")))
        if self.prompt_trained_rows:
            out.append(finding("S4", "error", f"the loss mask covers {self.prompt_trained_tokens} prompt tokens in "
                               f"{self.prompt_trained_rows} responses: prompt tokens are trained as if generated",
                               {"responses": self.prompt_trained_rows, "prompt_tokens_trained": self.prompt_trained_tokens},
                               self.example.get("S4", "dump")))
        return out


class Groups:
    """P16 from each (step, group)'s rewards: count, mean and sum of squared deviations (Welford's, exact for equal
    rewards: M2 stays 0)."""

    def __init__(self):
        self.open: dict[tuple[int, str], list] = {}
        self.groups = self.singletons = self.no_signal = self.near_zero = 0
        self.near_zero_examples: list[dict] = []
        self.last_step = None

    def add(self, rollout: Rollout) -> None:
        if rollout.reward is None:
            return
        if self.last_step is not None and rollout.step > self.last_step:  # dumps come step by step: close the earlier steps
            self._close(lambda key: key[0] < rollout.step)
        self.last_step = rollout.step if self.last_step is None else max(self.last_step, rollout.step)
        sums = self.open.setdefault((rollout.step, rollout.group), [0, 0.0, 0.0, rollout.where])  # Welford: n, mean, M2
        sums[0] += 1
        delta = rollout.reward - sums[1]
        sums[1] += delta / sums[0]
        sums[2] += delta * (rollout.reward - sums[1])

    def _close(self, which=lambda key: True) -> None:
        for key in [key for key in self.open if which(key)]:
            count, mean, squares, where = self.open.pop(key)
            if count < 2:
                self.singletons += 1
                continue
            self.groups += 1
            std = math.sqrt(squares / count)
            if squares == 0:
                self.no_signal += 1
            elif std <= NEAR_ZERO_STD * max(1.0, abs(mean)):
                self.near_zero += 1
                if len(self.near_zero_examples) < 5:
                    self.near_zero_examples.append({"step": key[0], "group": key[1], "reward_std": std, "where": where})

    def scalars(self) -> dict[str, float]:
        self._close()
        return {"inspect/no_signal_group_share": self.no_signal / self.groups} if self.groups else {}

    def findings(self) -> list[Finding]:
        self._close()
        out = []
        if self.near_zero:
            example = self.near_zero_examples[0]
            out.append(finding("P16", "error", f"{self.near_zero} groups have rewards equal up to rounding (std "
                               f"{example['reward_std']:.2g}): a std != 0 filter keeps them and dividing by their std "
                               "turns rounding residue into ±1 advantages", {"near_zero_groups": self.near_zero,
                                                                              "groups": self.groups,
                                                                              "examples": self.near_zero_examples},
                               example["where"]))
        if self.groups and self.no_signal / self.groups >= NO_SIGNAL_SHARE_WARNING:
            out.append(finding("P16", "warning", f"{self.no_signal / self.groups:.0%} of groups have all rewards equal: "
                               "no learning signal there (filter them, or make the task harder/easier)",
                               {"no_signal_groups": self.no_signal, "groups": self.groups,
                                "no_signal_share": self.no_signal / self.groups}))
        return out


class Staleness:
    """P28 from ``policy_version`` against ``step``."""

    def __init__(self):
        self.lags = Counter()
        self.example = "dump"

    def add(self, rollout: Rollout) -> None:
        if rollout.policy_version is None:
            return
        lag = rollout.step - rollout.policy_version
        self.lags[lag] += 1
        if lag > 0 and self.example == "dump":
            self.example = rollout.where

    def scalars(self) -> dict[str, float]:
        total = sum(self.lags.values())
        return {"inspect/stale_share": sum(n for lag, n in self.lags.items() if lag > 0) / total} if total else {}

    def findings(self) -> list[Finding]:
        total = sum(self.lags.values())
        stale = sum(count for lag, count in self.lags.items() if lag > 0)
        if not stale:
            return []
        mean_lag = sum(lag * count for lag, count in self.lags.items()) / total
        return [finding("P28", "warning", f"{stale} responses ({stale / total:.0%}) were sampled by a policy older than the step "
                        f"that trains on them (lag up to {max(self.lags)} steps, mean {mean_lag:.2g}): correct for it "
                        "(rollout correction) or bound the lag",
                        {"stale": stale, "stale_share": stale / total, "max_lag": max(self.lags), "mean_lag": mean_lag,
                         "lags": {str(lag): count for lag, count in sorted(self.lags.items())}}, self.example)]
