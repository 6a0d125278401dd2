"""The watch's checks of a rollout the policy trains on (P12, P6 from an engine): what the workbench's sampler or an
engine announces through ``workbench.core.observers`` (the model that sampled, its dtype, the engine's log-prob mode),
and in deep mode the rollout re-scored by the policy's own forward with verl's ``rollout_corr/`` diagnostics
(``watch.mismatch``).

``RolloutChecks`` is a part of ``watcher.Watch`` (its base class), kept apart so that each module stays one job: it uses
the watch's state (``model``, ``deep``, ``observed``, ``stop_ids``, ``_sampling``, ``_sampler_mismatch``,
``_steps_done``, ``_quiet``) and its ``_flag`` and ``_set_sampling``. Torch and the standard library only.
"""

from __future__ import annotations

import torch

from workbench.watch import mismatch, observe
from workbench.watch.callsite import call_site


class RolloutChecks:
    """``Watch``'s rollout checks: ``_on_sample`` (an announced rollout), ``_check_rollout_gap`` and ``_rescore`` (deep
    mode), ``_check_engine``, ``_check_sampler_precision`` (the P12 finding, when the policy trains on the rollout)."""

    def _on_sample(self, data: dict) -> None:
        """The workbench's sampler drew a rollout: its settings, and (P12) the dtype of the model that sampled it."""
        self.observed["sampler_calls"] += 1
        self.stop_ids |= set(data.get("stop_ids", []))
        self._set_sampling(temperature=float(data.get("temperature", 1.0)), top_k=int(data.get("top_k", 0)),
                           top_p=float(data.get("top_p", 1.0)), source="sampler")
        sampler, rollout = data.get("model"), data.get("rollout")
        if data.get("engine"):
            self._check_engine(data["engine"], float(data.get("temperature", 1.0)))
        elif sampler is not None and sampler is not self.model:
            sampler_dtype, policy_dtype = observe.parameter_dtype(sampler), observe.parameter_dtype(self.model)
            if sampler_dtype != policy_dtype:
                self._sampler_mismatch = ({"sampler_dtype": str(sampler_dtype).replace("torch.", ""),
                                           "policy_dtype": str(policy_dtype).replace("torch.", "")}, call_site(), "warning")
        else:
            return
        if self.deep and rollout is not None:  # the sampler's log-probs against the trainer's: rollout_corr/ diagnostics
            self._check_rollout_gap(rollout, self._sampling["temperature"], "an inference engine" if data.get("engine")
                                    else "a copy holding other weights than the policy's")

    def _check_rollout_gap(self, rollout, temperature: float, sampler: str) -> None:
        """P12 (deep mode): verl's ``rollout_corr/`` diagnostics of the sampler's log-probs against the policy's own
        forward on the same tokens (``watch.mismatch``), with the optimiser steps done (``step``) and the rollout's
        number; flagged when the policy trains on the rollout. ``sampler``: who drew it, for the message."""
        severity, evidence, crossed = mismatch.diagnose(*self._rescore(rollout, temperature))
        previous = self._sampler_mismatch
        if severity is None:
            if previous is not None:
                previous[0].update(evidence)
            return
        evidence.update(previous[0] if previous is not None else {"sampler": sampler}, step=self._steps_done,
                        rollout=self.observed["sampler_calls"])
        if crossed:
            evidence["thresholds_crossed"] = "; ".join(crossed)
        self._sampler_mismatch = (evidence, previous[1] if previous is not None else call_site(), severity)

    def _check_engine(self, engine: dict, temperature: float) -> None:
        """An inference engine drew the rollout (``workbench.engines``): P6 when it returned log-probs before temperature
        at τ ≠ 1 (vLLM's ``logprobs_mode="raw_logprobs"``, its default), P12 when it holds the weights in another
        dtype than the policy's."""
        where = call_site()
        if engine.get("logprobs_mode") == "raw_logprobs" and abs(temperature - 1.0) > 1e-6:
            self._flag("P6", "error", f"the rollout engine ({engine.get('name', 'vLLM')}) sampled at temperature {temperature:g} "
                       "but returned log-probs before temperature (logprobs_mode='raw_logprobs', vLLM's default): they are "
                       "not the sampling distribution's, so every ratio against them is off. Start the engine with "
                       "logprobs_mode='processed_logprobs'.", where=where, calls=1, temperature=temperature,
                       logprobs_mode="raw_logprobs", engine=engine.get("name", "vllm"))
        policy_dtype = str(observe.parameter_dtype(self.model)).replace("torch.", "")
        if engine.get("dtype") and engine["dtype"] != policy_dtype:
            self._sampler_mismatch = ({"sampler_dtype": engine["dtype"], "policy_dtype": policy_dtype,
                                       "engine": engine.get("name", "vllm")}, where, "warning")

    def _rescore(self, rollout, temperature: float) -> tuple:
        """The policy's own log-probs of a rollout's responses, the sampler's, and the response mask (deep mode)."""
        ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
        mask = torch.cat([rollout.prompt_mask, rollout.response_mask], 1)
        device = next(self.model.parameters()).device
        ids, mask = ids.to(device), mask.to(device)
        self._quiet = True
        try:
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.long().cumsum(-1) - 1).clamp(min=0),
                                    use_cache=False).logits
        finally:
            self._quiet = False
        return observe.rescored_logprobs(logits, ids, rollout, temperature)

    def _check_sampler_precision(self):
        """P12: the policy trains on a rollout sampled by another model: a copy of another dtype (light mode), or one
        whose log-probs the re-scoring found off the policy's (deep mode: ``_check_rollout_gap``)."""
        evidence, where, severity = self._sampler_mismatch
        self._sampler_mismatch = None
        sampler = (f"a {evidence['sampler_dtype']} copy while the policy trains in {evidence['policy_dtype']}"
                   if "sampler_dtype" in evidence else evidence.pop("sampler"))
        if evidence.get("thresholds_crossed"):
            message = (f"the rollout was sampled by {sampler}, and its log-probs are past verl's rollout-correction health "
                       f"thresholds ({evidence['thresholds_crossed']}; {mismatch.SOURCE}): uncorrected ratios against them "
                       "swing the gradient. Resync or re-precision the sampler, and correct with truncated importance "
                       "sampling or rejection (rollout_correction).")
        else:
            message = (f"the rollout was sampled by {sampler}: its log-probs are not the trainer's, so a ratio against them "
                       "is not 1 at the first step. Recompute π_old with the training forward (and correct with truncated "
                       "importance sampling).")
        self._flag("P12", severity, message, where=where, **evidence)
