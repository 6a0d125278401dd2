"""What PPO and GRPO share: sampling a rollout, scoring it with the training forward, and the
pitfall switches of both.

``RolloutConfig`` holds the fields the two configs share (the rollout, the clipped
objective, the rollout–training gap and its correction, and the switches of pitfalls S1, S3, P6, P7);
``RolloutTrainer`` holds the steps both trainers take the same way:

* ``sample_rollout`` — pick prompts with the step's seeded generator, left-pad them, sample at the
  configured temperature, stop at EOS (or not: S3); a group's repeated prompt is tokenised and
  prefilled once (``sample(share_prefill=True)``);
* ``logprobs`` — the training forward's per-token log-probs of the sampled responses, with the
  position-id (S1) and temperature (P6) switches, optional packing and prompt sharing
  (``share_prompts``, on by default: a prompt repeated by a group runs once, its responses after it
  in one row under a prefix-tree attention mask);
* ``score_in_layout`` — the same, computed mini-batch by mini-batch in the layout the optimiser
  steps will see, so that π_old and the reference are scored by exactly the forward that trains
  (ρ = 1 and KL = 0 before any update, also in bf16: see ``tests/trainers/test_invariances.py``);
* ``rollout_sampler`` — the model that samples when the gap is asked for: a copy of the policy at
  ``sampler_precision``, holding the weights of ``rollout_staleness`` steps ago;
* ``correct_rollout`` — ``core.rollout_correction`` on π_old and the sampler's log-probs (``rollout_correction``);
* ``dump_step`` — with ``dump_rollouts`` set, the step's responses as the generic dump records
  (``core.rollout_dump``: ids, the sampler's and π_old's log-probs per token, loss mask, reward, finish reason,
  temperature, the step whose weights sampled them), one file per step, written whole before the next step starts.

``sampler="vllm"`` samples with vLLM's CPU build instead (``workbench.engines.sampler.EngineSampler``, in the engine
environment's process): the policy's weights pushed through the engine's reload path before every step's rollout, the
prefix cache reset after each push, the engine's dtype ``sampler_precision``; its ``rollout_corr/`` metrics (the
engine against the training forward on the same weights) are logged every step.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import torch

from workbench.core import losses
from workbench.core import rollout_correction as correction
from workbench.core.batching import pad_sequences
from workbench.core.errors import ConfigError, RolloutCorrectionError
from workbench.core.rollout_dump import FORMATS as DUMP_FORMATS
from workbench.core.rollout_dump import DumpError, RolloutDumpWriter, step_records
from workbench.engines.checks import LOGPROBS_MODES
from workbench.engines.sampler import EngineOptions, EngineSampler
from workbench.modeling.rollout import Rollout, sample
from workbench.modeling.scoring import POSITION_IDS_MODES, response_logprobs, tree_capable
from workbench.modeling.stop_ids import stop_token_ids
from workbench.tasks import CHAT_TEMPLATE_MODES, Problem, prompt_ids, uses_chat_template
from workbench.trainers.base import Trainer, TrainerConfig, require, require_choice, sampling_generator, step_generator

SAMPLER_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SAMPLERS = ("workbench", "vllm")


@dataclass
class RolloutConfig(TrainerConfig):
    """What PPO and GRPO configs share: the rollout, the clipped objective, S1/S3/P6/P7 switches."""

    # ---- Rollout ---------------------------------------------------------------------------
    prompts_per_step: int = 8
    """Distinct prompts sampled per step."""
    mini_batches: int = 1
    """Optimiser steps per pass over the rollout batch (the batch is split into this many mini-batches)."""
    max_new_tokens: int = 8
    """Longest response the sampler may produce."""
    temperature: float = 1.0
    """Sampling temperature; the training forward divides the logits by it too (unless P6's switch is on)."""
    missing_eos_penalty: float = 0.0
    """Subtracted from the reward of a response that never produced EOS (TRL's ``missing_eos_penalty``)."""
    chat_template: str = "auto"
    """``auto``: prompts go through the tokenizer's chat template (as a user turn, with the generation
    prompt) when it has one, and the template's turn end becomes a stop id; ``none``: raw prompt text."""
    # ---- Policy objective ------------------------------------------------------------------
    clip_low: float = 0.2
    """ε_low: the importance ratio is clipped below at 1 − ε_low."""
    clip_high: float = 0.2
    """ε_high: the ratio is clipped above at 1 + ε_high (DAPO's clip-higher uses e.g. 0.28)."""
    loss_agg: str = "token-mean"
    """Aggregation of the per-token loss: verl names or TRL aliases (see ``losses.aggregate_loss``)."""
    # ---- Efficiency ------------------------------------------------------------------------
    packed: bool = False
    """Score with padding-free packed batches (one row, restarting position ids, no mask, no
    cache) instead of padded ones: same numbers up to float noise, less wasted compute."""
    share_prompts: bool = True
    """Training forward: a prompt shared by several rows (GRPO's groups, a prompt PPO drew twice) is run once, its
    responses after it in one row under a prefix-tree attention mask (``scoring.response_logprobs``):
    same numbers up to float noise (~1e-7 in fp32), fewer tokens through the model (GRPO on the
    tiny model: 1.25× steps/s). Used with mask-derived position ids, padded layout, sdpa attention
    and dropout off; otherwise the plain forward runs."""
    static_cache: bool = True
    """Sampling: Llama/Qwen2 models under sdpa decode on a preallocated KV cache without
    ``model(...)`` (``modeling.decode.StaticDecoder``): the same tokens, log-probs within float
    noise (≤ 1e-6 measured in fp32); other models, hooks (but a watch's) or active dropout take ``model(...)``."""
    cuda_graph: bool = False
    """Sampling on a CUDA GPU, with ``static_cache``: each decode step replays one CUDA graph recorded per
    rollout (``modeling.graphed_decode``). Attention then spans the whole preallocated cache under a mask, so
    log-probs move by float noise (measured in docs/GPU.md): off by default; ignored on a CPU and under
    ``precision="bf16-mixed"`` (autocast: not verified with graphs), where the static decoder runs."""
    sampling_draw: str = "multinomial"
    """Sampling: ``multinomial`` (``torch.multinomial``) or ``inverse_cdf`` (one uniform per row
    against the cumulative probabilities: the same distribution, other tokens per seed; ~10× cheaper
    per step at a 32k vocabulary on a CPU)."""
    # ---- Rollout–training gap and its correction --------------------------------------------
    rollout_correction: str | dict | None = None
    """Importance weights and rejection for the gap between the sampler and the training forward
    (``core.rollout_correction``): None (the workbench's fp32 sampler has no gap), a preset name
    (``decoupled_token_is``, ``decoupled_seq_is_rs``, ``trl_sequence_mask``, …: ``PRESETS``), a dict of
    verl's keywords (``{"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "seq_mean_k1",
    "rollout_rs_threshold": "0.999_1.001"}``) or of TRL's (``{"vllm_importance_sampling_mode": "token_mask",
    "vllm_importance_sampling_clip_min": 0.5}``). Each step logs its ``rollout_corr/`` metrics."""
    sampler_precision: str = "fp32"
    """The sampler's weights: ``fp32`` (the policy itself), ``bf16`` or ``fp16`` (a copy cast down, as an
    inference engine in low precision): opens the gap ``rollout_correction`` corrects."""
    sampler: str = "workbench"
    """Who samples the rollouts: ``workbench`` (the workbench's own sampler) or ``vllm`` (vLLM's CPU build in the
    engine environment, ``make engines``; the model's head dim must be one its CPU attention runs, as in the
    ``tiny-<task>-qwen2-hd32`` checkpoints). With ``vllm`` the ``rollout_corr/`` metrics are logged every step."""
    engine_logprobs_mode: str = "processed_logprobs"
    """``sampler="vllm"``: the log-probs the engine returns, ``processed_logprobs`` (after temperature: the sampling
    distribution's; fix) or ``raw_logprobs`` (vLLM's default: before temperature; bug at temperature ≠ 1)."""
    engine_reset_prefix_cache: bool = True
    """``sampler="vllm"``: reset the engine's prefix cache after every weight push (fix); False serves KV cached under
    the old weights to prompts seen before (bug)."""
    rollout_staleness: int = 0
    """Sample with the policy's weights of this many steps ago (each step is ``optimizer_steps_per_batch``
    updates; fewer steps into the run, the initial weights): an asynchronous trainer's stale rollouts."""
    # ---- Rollout dump ----------------------------------------------------------------------
    dump_rollouts: str | None = None
    """A folder to write every step's responses into, one record per response (``core.rollout_dump``: token ids, the
    sampler's and the training forward's log-probs, loss mask, reward, finish reason, policy version), one file per
    step written whole: what ``python -m workbench inspect`` reads. One process only."""
    dump_format: str = "jsonl"
    """``jsonl`` or ``parquet`` (needs pyarrow): the format of the ``dump_rollouts`` files."""
    # ---- Pitfall switches (the default is the fix) -----------------------------------------
    position_ids: str = "mask"
    """S1: ``mask`` derives the training forward's position ids from the attention mask (fix);
    ``model`` leaves them to the model, shifted by each row's left padding (bug)."""
    stop_at_eos: bool = True
    """S3: stop decoding once every row has produced EOS (fix); False decodes ``max_new_tokens``
    steps every time and throws the tail away (bug)."""
    rescale_by_temperature: bool = True
    """P6: recompute log-probs from logits / temperature (fix); False scores raw logits (bug)."""
    disable_dropout: bool = True
    """P7: set every dropout probability to 0 in every model (fix); False leaves dropout on with the
    models in train mode (bug)."""

    def validate(self) -> None:
        super().validate()
        require(self, "prompts_per_step", self.prompts_per_step >= 1, "must be ≥ 1")
        require(self, "mini_batches", self.mini_batches >= 1 and self.prompts_per_step % self.mini_batches == 0,
                "must be ≥ 1 and divide prompts_per_step")
        require(self, "max_new_tokens", self.max_new_tokens >= 1, "must be ≥ 1")
        require(self, "temperature", self.temperature > 0, "must be > 0")
        require(self, "missing_eos_penalty", self.missing_eos_penalty >= 0, "must be ≥ 0 (it is subtracted)")
        require(self, "clip_low", 0 < self.clip_low < 1, "must be in (0, 1)")
        require(self, "clip_high", self.clip_high > 0, "must be > 0")
        valid = losses.LOSS_AGG_MODES + tuple(losses.LOSS_AGG_ALIASES)
        require(self, "loss_agg", self.loss_agg in valid, f"is not a loss aggregation mode; valid: {valid}")
        require_choice(self, "position_ids", POSITION_IDS_MODES)
        require_choice(self, "chat_template", CHAT_TEMPLATE_MODES)
        require_choice(self, "sampler_precision", tuple(SAMPLER_PRECISIONS))
        require(self, "rollout_staleness", self.rollout_staleness >= 0, "must be ≥ 0 (steps)")
        require_choice(self, "sampler", SAMPLERS)
        require_choice(self, "engine_logprobs_mode", LOGPROBS_MODES)
        require_choice(self, "dump_format", DUMP_FORMATS)
        require(self, "rollout_staleness", self.sampler == "workbench" or self.rollout_staleness == 0,
                "must be 0 with sampler='vllm' (the engine holds the latest weights)")
        try:
            correction.resolve(self.rollout_correction)
        except RolloutCorrectionError as exc:
            raise ConfigError(f"{type(self).__name__}.rollout_correction={self.rollout_correction!r}: {exc}",
                              field="rollout_correction") from None

    @property
    def watches_gap(self) -> bool:
        """A correction is asked for, or the sampler differs from the policy: the ``rollout_corr/`` metrics are logged."""
        return (self.rollout_correction is not None or self.sampler_precision != "fp32" or self.rollout_staleness > 0
                or self.sampler != "workbench")

    @property
    def scoring_temperature(self) -> float:
        """The temperature the training forward divides by (1 with P6's bug switched on)."""
        return self.temperature if self.rescale_by_temperature else 1.0


class RolloutTrainer(Trainer):
    """Base of PPO and GRPO: subclasses set ``policy``, ``tokenizer``, ``problems``, ``config``,
    ``device`` and implement ``train_step``."""

    config: RolloutConfig
    problems: list[Problem]
    # where the dump goes and in which format: reporting, not computing, so a resumed run may change them
    RESUMABLE_CHANGES = Trainer.RESUMABLE_CHANGES + ("dump_rollouts", "dump_format")

    @property
    def stop_ids(self) -> list[int]:
        """Every id that ends a response (tokenizer ∪ generation config ∪ chat-template turn end)."""
        if getattr(self, "_stop_ids", None) is None:
            self._stop_ids = stop_token_ids(self.policy, self.tokenizer,
                                            chat_template=uses_chat_template(self.tokenizer, self.config.chat_template))
        return self._stop_ids

    def sample_rollout(self, step: int, *, repeats: int = 1, sampler=None) -> tuple[list[Problem], Rollout]:
        """Pick ``prompts_per_step`` prompts with the step's generator (each ``repeats`` times in a
        row: GRPO's groups) and sample one response for each row with ``sampler`` (the policy)."""
        c = self.config
        generator = step_generator(c.seed, step)
        picks = torch.randint(len(self.problems), (c.prompts_per_step,), generator=generator).tolist()
        problems = [self.problems[i] for i in picks for _ in range(repeats)]
        # each problem tokenised once per run, its row repeated (the same tensors as encoding every row)
        encoded = pad_sequences([self._prompt_tokens(i) for i in picks], self.tokenizer.pad_token_id, side="left")
        prompt_ids, prompt_mask = (t.repeat_interleave(repeats, dim=0).to(self.device) for t in encoded)
        if isinstance(sampler, EngineSampler):
            rollout = sampler.sample(prompt_ids, prompt_mask, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                                     eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id,
                                     stop_at_eos=c.stop_at_eos, seed=c.seed * 1_000_003 + step)
            return problems, rollout
        rollout = sample(
            self.policy if sampler is None else sampler, prompt_ids, prompt_mask, max_new_tokens=c.max_new_tokens,
            temperature=c.temperature, eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id,
            stop_at_eos=c.stop_at_eos, generator=sampling_generator(generator, self.device, c.seed, step),
            share_prefill=repeats > 1, static_cache=c.static_cache, draw=c.sampling_draw, cuda_graph=c.cuda_graph,
        )
        return problems, rollout

    def _prompt_tokens(self, index: int) -> list[int]:
        """Token ids of problem ``index``'s prompt (``tasks.prompt_ids``), tokenised once per run."""
        cache = self.__dict__.setdefault("_prompt_token_cache", {})  # keyed by text: safe if problems change
        text = self.problems[index].prompt
        if text not in cache:
            cache[text] = prompt_ids(self.tokenizer, text, self.config.chat_template)
        return cache[text]

    def logprobs(self, model, rollout: Rollout, rows=slice(None), with_entropy: bool = False):
        """The training forward's log-probs (B, R) of the sampled responses of ``rows``."""
        c = self.config
        return response_logprobs(
            model, rollout.prompt_ids[rows], rollout.prompt_mask[rows], rollout.response_ids[rows], rollout.response_mask[rows],
            position_ids=c.position_ids, with_entropy=with_entropy, packed=c.packed, temperature=c.scoring_temperature,
            share_prompts=self.shares_prompts,
        )

    @property
    def shares_prompts(self) -> bool:
        """``share_prompts``, for every model alike, when the model that trains can take the
        prefix-tree forward (not a DDP wrapper): policy, π_old and reference then share one path."""
        return self.config.share_prompts and tree_capable(getattr(self, "train_policy", self.policy))

    @torch.no_grad()
    def score_in_layout(self, model, rollout: Rollout, layout: list[torch.Tensor]) -> torch.Tensor:
        """Log-probs of every row, computed mini-batch by mini-batch in the training ``layout``
        (a list of row-index tensors), so they come from exactly the forward that trains."""
        out = torch.zeros_like(rollout.response_ids, dtype=torch.float32)
        for rows in layout:
            out[rows] = self.logprobs(model, rollout, rows)
        return out

    def rollout_sampler(self):
        """None (the policy samples) or the copy that does: at ``sampler_precision``, holding the weights of
        ``rollout_staleness`` steps ago. Called once per step, before sampling; the weights it keeps live on
        the policy's device and are not saved in checkpoints (a resumed run starts its staleness afresh)."""
        c = self.config
        if c.sampler == "vllm":
            return self.engine_sampler()
        if c.sampler_precision == "fp32" and c.rollout_staleness == 0:
            return None
        history = self.__dict__.setdefault("_sampler_weights", deque(maxlen=c.rollout_staleness + 1))
        history.append({name: value.detach().clone() for name, value in self.policy.state_dict().items()})
        sampler = self.__dict__.get("_sampler")
        if sampler is None:
            sampler = copy.deepcopy(self.policy).to(SAMPLER_PRECISIONS[c.sampler_precision]).requires_grad_(False)
            self._sampler = sampler
        sampler.load_state_dict(history[0])  # cast into the sampler's dtype
        sampler.train(self.policy.training)
        return sampler

    def engine_sampler(self) -> EngineSampler:
        """``sampler="vllm"``: the engine, started with the policy's weights on the first call, the policy's current
        weights pushed to it (then its prefix cache reset, unless ``engine_reset_prefix_cache`` is off) on later ones."""
        c = self.config
        engine = self.__dict__.get("_engine")
        if engine is not None and engine.running:
            engine.push_weights(self.policy)
            return engine
        options = EngineOptions(precision=c.sampler_precision, logprobs_mode=c.engine_logprobs_mode,
                                reset_prefix_cache=c.engine_reset_prefix_cache, seed=c.seed)
        self._engine = EngineSampler(options, name=getattr(self.policy.config, "_name_or_path", None) or "the policy")
        return self._engine.start(self.policy)

    def engine_metrics(self) -> dict:
        """``sampler="vllm"``: the engine's numbers of the step (prompt tokens served from its prefix cache, its
        seconds); empty otherwise."""
        engine = self.__dict__.get("_engine")
        if engine is None or self.config.sampler != "vllm":
            return {}
        cached = engine.last_generate.get("cached", [])
        return {"engine/cached_prompt_tokens": float(sum(cached)), "engine/generate_seconds": engine.last_generate.get("seconds", 0.0),
                "engine/pushes": float(engine.pushes)}

    def close_engine(self) -> None:
        engine = self.__dict__.pop("_engine", None)
        if engine is not None:
            engine.close()

    def train(self, steps: int | None = None, on_step=None) -> list[dict]:
        """``Trainer.train``; the engine process (``sampler="vllm"``) is ended when it returns or raises (a later
        ``train`` starts it again with the policy's weights)."""
        try:
            return super().train(steps, on_step)
        finally:
            self.close_engine()

    def policy_version(self, step: int) -> int:
        """The step whose weights sampled step ``step``'s rollout: ``step`` itself, or ``rollout_staleness`` steps
        earlier once the sampler's weight history is that long (``rollout_sampler``)."""
        history = self.__dict__.get("_sampler_weights")
        return step if history is None or self.config.sampler != "workbench" else step - (len(history) - 1)

    def dump_step(self, step: int, rollout: Rollout, *, rewards: torch.Tensor, loss_mask: torch.Tensor,
                  trainer_logprobs: torch.Tensor | None, group_size: int) -> None:
        """With ``dump_rollouts`` set: write step ``step``'s responses (``core.rollout_dump``), the first call of a run
        removing the files of this and later steps a killed run left. ``trainer_logprobs``: π_old per token."""
        c = self.config
        if c.dump_rollouts is None:
            return
        writer = self.__dict__.get("_dump_writer")
        if writer is None:
            if self.dist is not None and self.dist.enabled:
                raise ConfigError(f"dump_rollouts={c.dump_rollouts!r}: rollout dumps are written by one process only; "
                                  "run without accelerate launch, or leave dump_rollouts unset", field="dump_rollouts")
            try:
                writer = RolloutDumpWriter(str(c.dump_rollouts), format=c.dump_format)
            except DumpError as exc:
                raise ConfigError(str(exc), field="dump_rollouts") from None
            writer.start(step)
            self._dump_writer = writer
        records = step_records(
            step, prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask, response_ids=rollout.response_ids,
            response_mask=rollout.response_mask, reward=rewards, finished=rollout.finished,
            rollout_logprobs=rollout.rollout_logprobs, trainer_logprobs=trainer_logprobs, loss_mask=loss_mask,
            group_size=group_size, temperature=c.temperature, policy_version=self.policy_version(step),
        )
        writer.write_step(step, records)

    def correct_rollout(self, old_logp: torch.Tensor, rollout: Rollout, mask: torch.Tensor):
        """``core.rollout_correction`` on π_old and the sampler's log-probs over ``mask``: a ``Correction`` whose
        metrics hold the ``rollout_corr/`` mismatch metrics too, with ``abs_log_ratio_max`` and ``_mean`` (max and
        mean |log π_old − log π_sampler| over the tokens; ``rollout_correction`` None: weights None, the mask
        unchanged). None when no response token is left to correct."""
        if not bool(mask.bool().any()):
            return None
        spec = correction.resolve(self.config.rollout_correction)
        if spec is None:
            result = correction.Correction(None, mask, correction.mismatch_metrics(old_logp, rollout.rollout_logprobs, mask))
        else:
            result = correction.apply(spec, old_logp, rollout.rollout_logprobs, mask)
            if isinstance(spec, correction.TrlMode):
                result.metrics.update(correction.mismatch_metrics(old_logp, rollout.rollout_logprobs, mask))
        gap = (old_logp.detach().float() - rollout.rollout_logprobs.float()).abs()[mask.bool()]
        result.metrics[correction.PREFIX + "abs_log_ratio_max"] = float(gap.max())  # max |Δ log p| over the tokens
        result.metrics[correction.PREFIX + "abs_log_ratio_mean"] = float(gap.mean())
        return result
