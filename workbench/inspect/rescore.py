"""The inspector with a model (``--model``): tokenise and score text-only responses, and find the temperature the
rollout's log-probs were taken at (P6: log-probs taken before temperature).

A sampler that draws at τ ≠ 1 but returns the log-probs of the raw logits (τ = 1) hands the trainer log-probs of
another distribution than the one sampled: the importance ratio is off by the temperature alone. Re-scoring the
response tokens with the model at a grid of temperatures, the τ whose log-probs lie closest to the rollout's (mean
|Δ| per token) is the one the sampler used for them; when that τ is not the recorded one, the finding names both.
Only the first ``sample`` responses with ids and rollout log-probs are re-scored (one forward each), so the cost is
bounded whatever the dump's size. The model is loaded with transformers, never with ``trust_remote_code``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from workbench.inspect.findings import finding
from workbench.inspect.records import DumpError, Rollout

GRID = tuple(round(0.3 + 0.05 * i, 2) for i in range(35))  # 0.3 … 2.0
MATCH_RATIO = 2.0  # P6: the recorded τ's mean |Δ| at least this many times the best τ's


def load(model):
    """(model, tokenizer) from a checkpoint path or a pair; ``DumpError`` naming ``--model`` when it cannot be loaded."""
    if isinstance(model, (tuple, list)) and len(model) == 2:
        return model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        network = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DumpError("--model", f"{model!r} cannot be loaded ({first}); give a local checkpoint folder with "
                                   "config.json, the weights and the tokenizer") from None
    return network.eval(), tokenizer


class Rescorer:
    def __init__(self, model, sample: int = 64):
        self.model, self.tokenizer = load(model)
        self.sample, self.scored = sample, 0
        self.temperatures = sorted(set(GRID))
        self.gap = np.zeros(len(self.temperatures))
        self.tokens = 0
        self.recorded: dict[float, int] = {}
        self.example = "dump"
        self.tokenised = 0

    @torch.no_grad()
    def _logits(self, prompt_ids: np.ndarray, response_ids: np.ndarray) -> torch.Tensor:
        """The logits that predict each response token, (response length, vocabulary), float32."""
        ids = torch.as_tensor(np.concatenate([prompt_ids, response_ids]), dtype=torch.long)[None]
        logits = self.model(input_ids=ids).logits[0].float()
        return logits[len(prompt_ids) - 1: len(ids[0]) - 1]

    def _score(self, logits: torch.Tensor, response_ids: np.ndarray, temperature: float) -> np.ndarray:
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        return log_probs.gather(-1, torch.as_tensor(response_ids, dtype=torch.long)[:, None])[:, 0].double().numpy()

    def prepare(self, rollout: Rollout) -> Rollout:
        """A text-only response tokenised and scored (trainer log-probs at its temperature); a response with rollout
        log-probs re-scored over the temperature grid while fewer than ``sample`` were."""
        if rollout.response_ids is None:
            prompt = self.tokenizer(rollout.prompt_text or "")["input_ids"]
            response = self.tokenizer(rollout.response_text or "", add_special_tokens=False)["input_ids"]
            prompt_ids, response_ids = np.asarray(prompt, dtype=np.int64), np.asarray(response, dtype=np.int64)
            if not len(prompt_ids):  # the first response token needs a position before it
                prompt_ids = np.asarray([self.tokenizer.bos_token_id or self.tokenizer.eos_token_id or 0], dtype=np.int64)
            trainer = (self._score(self._logits(prompt_ids, response_ids), response_ids, rollout.temperature or 1.0)
                       if len(response_ids) else np.zeros(0))
            self.tokenised += 1
            return dataclasses.replace(rollout, prompt_ids=prompt_ids, response_ids=response_ids, trainer_logprobs=trainer)
        if (self.scored < self.sample and rollout.rollout_logprobs is not None and rollout.prompt_ids is not None
                and len(rollout.prompt_ids) and rollout.response_length):
            logits = self._logits(rollout.prompt_ids, rollout.response_ids)
            keep = rollout.mask() & np.isfinite(rollout.rollout_logprobs)
            for index, temperature in enumerate(self.temperatures):
                scored = self._score(logits, rollout.response_ids, temperature)
                self.gap[index] += float(np.abs(scored - rollout.rollout_logprobs)[keep].sum())
            self.tokens += int(keep.sum())
            recorded = 1.0 if rollout.temperature is None else rollout.temperature
            self.recorded[recorded] = self.recorded.get(recorded, 0) + 1
            self.scored += 1
            if self.example == "dump":
                self.example = rollout.where
        return rollout

    def findings(self) -> list:
        if not self.tokens:
            return []
        gaps = self.gap / self.tokens
        best = self.temperatures[int(np.argmin(gaps))]
        recorded = max(self.recorded, key=self.recorded.get)
        at_recorded = float(np.interp(recorded, self.temperatures, gaps))
        evidence = {"recorded_temperature": recorded, "best_temperature": best, "mean_abs_gap_at_best": float(gaps.min()),
                    "mean_abs_gap_at_recorded": at_recorded, "responses_rescored": self.scored, "tokens": self.tokens,
                    "gap_by_temperature": {f"{t:g}": float(g) for t, g in zip(self.temperatures, gaps, strict=True)}}
        if abs(best - recorded) > 0.05 + 1e-9 and at_recorded >= MATCH_RATIO * gaps.min():
            before = " — log-probs taken before temperature" if abs(best - 1.0) < abs(recorded - 1.0) else ""
            return [finding("P6", "error", f"the rollout's log-probs match the model re-scored at τ = {best:g} (mean |Δ| "
                            f"{gaps.min():.3g}), not at the recorded τ = {recorded:g} (mean |Δ| {at_recorded:.3g}){before}",
                            evidence, self.example)]
        return []
