"""Sampling responses from a policy, and what happens at the end-of-sequence token.

``sample`` is the rollout engine of the trainers: a cached, batched sampling loop over any
Hugging Face causal LM. Like ``transformers``' ``generate`` it takes left-padded prompts and
derives position ids from the attention mask; unlike it, everything is explicit:

* ``stop_at_eos=True`` (fix): a finished row emits pad tokens and decoding stops as soon as every
  row has produced EOS (or a custom stop token);
* ``stop_at_eos=False`` (pitfall S3, TRL's old PPOTrainer): decoding always runs
  ``max_new_tokens`` steps and the text after EOS is thrown away afterwards.

``top_k``/``top_p`` (default off) truncate the sampling distribution with
``workbench.core.sampling_filters`` after the temperature divide; ``rollout_logprobs`` are then the
*processed* log-probs (renormalised over the kept tokens, as vLLM's ``processed_logprobs``), so a
scorer must apply the same filters to agree with them (pitfall P14).

Either way the response goes through ``truncate_after_eos``: tokens after the first EOS are
replaced by pad and masked out of every loss, the EOS itself stays an action.

The model is used in whatever mode the caller left it (``eval()`` for sampling without dropout).
Sampling uses an explicit ``torch.Generator``: the trainers seed one per step, so a rollout is
reproducible whatever happened before it, and the bug/fix runs of S3 sample identical responses.
``engine="hf"`` runs ``model.generate`` instead (for cross-checks; same tokens for the same seed).

Speed: the loop runs under ``torch.inference_mode`` (the returned tensors are ordinary ones), and
``share_prefill=True`` (GRPO's groups: each prompt repeated ``num_generations`` times) runs the
prompt forward once per *distinct* prompt and copies its KV cache to the repeated rows. The sampled
distribution is the same; the logits differ from a prefill of every row by matmul float noise
(~1e-7 in fp32: a kernel may sum in another order for another number of rows), so it is off by
default and turned on only by the trainers' group sampling.

``static_cache=True`` runs the decode steps of a Llama/Qwen2 model under sdpa without
``model(...)``: ``workbench.modeling.decode.StaticDecoder`` copies the prefill's KV cache into
buffers preallocated for the batch and runs the layers' maths inline, op for op as
``transformers`` does, so its logits equal ``model(...)``'s (bitwise on the models tested; the
tests hold tokens equal and log-probs within 1e-5). Any other model, attention back-end, a model
with forward hooks (other than a ``workbench.watch``'s, to which the decoder reports its calls) or with
dropout active goes through ``model(...)``. Off by default in
``sample`` (the prefill's LM head runs on the last position only: log-probs move by ≤ ~1e-6, float
noise; the tests hold the tokens equal); the trainers turn it on (``RolloutConfig.static_cache``).

``cuda_graph=True`` (with ``static_cache``, on a CUDA model; default off) records that decoder's step once per
call as a CUDA graph and replays it per token (``workbench.modeling.graphed_decode``): one launch instead of a
dozen per layer. Its attention spans the whole preallocated cache under a mask, so the log-probs move by float
noise: its own switch (``RolloutConfig.cuda_graph``).

The default draw is ``torch.multinomial``'s: on a CPU through ``workbench.modeling.draw.multinomial_one``,
which replicates it (the same tokens and generator state, bitwise, in about half the time at a 32k
vocabulary; see that module).

``draw="inverse_cdf"`` (default ``"multinomial"``) samples each token from one uniform per row
against the cumulative probabilities instead of ``torch.multinomial``, which draws an exponential
variate per vocabulary entry (Gumbel-max in disguise: ~6 ms per step for 8 rows × 32k tokens on one
CPU core, ~3 ms through ``multinomial_one``, against ~0.5 ms). The distribution is the same, the tokens for a given seed are not: a
different algorithm, its own switch, off everywhere by default (tests/modeling/test_decode.py checks
its frequencies against the probabilities).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from workbench.core import observers
from workbench.core.batching import padding_side_of, position_ids_from_mask, repeated_rows
from workbench.core.devices import generator_on, model_device
from workbench.core.errors import NonFiniteError
from workbench.core.losses import zero_masked
from workbench.core.sampling_filters import check_filters, filter_logits
from workbench.modeling.decode import StaticDecoder, unsupported_reason
from workbench.modeling.draw import multinomial_one
from workbench.modeling.graphed_decode import GraphedDecoder, capturable

LOGPROBS_MODES = ("processed", "raw")
DRAWS = ("multinomial", "inverse_cdf")


def _stop_ids(eos_token_id: int | Sequence[int], device=None) -> torch.Tensor:
    """The stop ids as a tensor on ``device`` (the ids' device: never a CPU tensor on a GPU path)."""
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or any(i is None for i in ids):
        raise ValueError(f"eos_token_id={eos_token_id!r} must name at least one stop token id (an int or a list of ints)")
    return torch.tensor(ids, dtype=torch.long, device=device)


def truncate_after_eos(
    response_ids: torch.Tensor, eos_token_id: int | Sequence[int], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``: everything after the first EOS becomes pad with mask 0; the EOS is kept.

    A row without EOS (a truncated response) keeps all its tokens with mask 1.
    ``eos_token_id`` may be a list of stop tokens.
    """
    is_stop = torch.isin(response_ids, _stop_ids(eos_token_id, response_ids.device))
    stops_so_far = is_stop.long().cumsum(-1)
    after_first_stop = (stops_so_far - is_stop.long()) > 0
    ids = response_ids.masked_fill(after_first_stop, pad_token_id)
    return ids, (~after_first_stop).long()


@dataclass
class Rollout:
    """A batch of sampled responses.

    ``prompt_ids``/``prompt_mask``: (B, P), left-padded. ``response_ids``/``response_mask``:
    (B, R) after ``truncate_after_eos`` (right-padded). ``rollout_logprobs``: log-prob of each
    sampled token under the sampling distribution (logits / temperature, then the top-k/top-p
    filters renormalised over the kept tokens), 0 where masked.
    ``finished``: the response contains EOS. ``decode_steps``: forward passes made after the
    prompt; ``tokens_generated`` = B × decode_steps (everything the sampler produced, wasted or not).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    finished: torch.Tensor
    decode_steps: int
    tokens_generated: int
    seconds: float

    @property
    def tokens_needed(self) -> int:
        """Response tokens up to and including each row's first EOS."""
        return int(self.response_mask.sum())

    @property
    def waste_fraction(self) -> float:
        """Share of generated tokens that were thrown away (after EOS, or after every row finished)."""
        return 1.0 - self.tokens_needed / max(self.tokens_generated, 1)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    def to(self, device: torch.device) -> Rollout:
        """The same rollout with its tensors on ``device`` (itself when they are there already)."""
        if self.prompt_ids.device == torch.device(device):
            return self
        tensors = {f.name: getattr(self, f.name).to(device) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **tensors)

    def sequences(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt and response side by side: ``(input_ids, attention_mask)``."""
        return (
            torch.cat([self.prompt_ids, self.response_ids], dim=1),
            torch.cat([self.prompt_mask, self.response_mask], dim=1),
        )


def rollout_agreement(a: Rollout, b: Rollout) -> dict:
    """How far two rollouts of the same prompts agree — one seed through two sampling paths, say (the benchmarks' and
    ``scripts/gpu_check.py``'s check of a speed path against the plain one).

    ``rows``; ``identical_rows``: rows whose sampled tokens and response masks are all equal, at equal widths (the same
    tokens with another end of response are another response); ``same_tokens``: every row is; ``first_divergent_row``:
    None when they are, else the first row that differs (``"lengths differ"`` when only the widths do);
    ``max_abs_logprob_gap``: the largest |Δ log p| over the response tokens both sampled while their row still agreed
    (0.0 when none did) — a gap after a row diverged compares different tokens."""
    width = min(a.response_ids.shape[1], b.response_ids.shape[1])
    equal = a.response_ids[:, :width] == b.response_ids[:, :width]
    same_width = a.response_ids.shape[1] == b.response_ids.shape[1]
    rows_equal = equal.all(-1) & (a.response_mask[:, :width] == b.response_mask[:, :width]).all(-1)
    identical = rows_equal & same_width
    agreeing = equal.long().cumprod(-1).bool() & a.response_mask[:, :width].bool() & b.response_mask[:, :width].bool()
    gap = (a.rollout_logprobs[:, :width] - b.rollout_logprobs[:, :width])[agreeing].abs()
    differs = (~rows_equal).nonzero()
    same = bool(identical.all())
    return {"rows": int(a.response_ids.shape[0]), "identical_rows": int(identical.sum()), "same_tokens": same,
            "first_divergent_row": None if same else (int(differs[0]) if len(differs) else "lengths differ"),
            "max_abs_logprob_gap": float(gap.max()) if gap.numel() else 0.0}


@torch.no_grad()
def sample(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int],
    pad_token_id: int,
    temperature: float = 1.0,
    stop_at_eos: bool = True,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    engine: str = "workbench",
    top_k: int = 0,
    top_p: float = 1.0,
    share_prefill: bool = False,
    static_cache: bool = False,
    draw: str = "multinomial",
    cuda_graph: bool = False,
    logprobs_mode: str = "processed",
) -> Rollout:
    """Sample up to ``max_new_tokens`` tokens for each left-padded prompt (see module doc).

    ``top_k`` (0 = off) and ``top_p`` (1.0 = off) truncate the distribution after the temperature.
    ``share_prefill``: one prompt forward per distinct prompt row (see module doc).
    ``static_cache``: decode steps by ``workbench.modeling.decode.StaticDecoder`` where it supports the model
    (see module doc); False always calls ``model(...)``.
    ``draw``: ``"multinomial"`` (``torch.multinomial``) or ``"inverse_cdf"`` (see module doc).
    ``cuda_graph``: with ``static_cache`` on a CUDA model, each decode step replays one captured CUDA graph
    (``workbench.modeling.graphed_decode``: attention over the whole cache buffer under a mask, so log-probs move by
    float noise); ignored on a CPU and under CUDA autocast (``graphed_decode.capturable``).
    ``logprobs_mode``: ``"processed"`` (default) returns the log-probs of the distribution each token was drawn from
    (after temperature and filters); ``"raw"`` returns them from the untempered, unfiltered logits, as vLLM's default
    ``raw_logprobs`` does (pitfall P47, notebook 47).
    """
    check_filters(top_k, top_p)
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode={logprobs_mode!r}; use one of {LOGPROBS_MODES}")
    truncated = (top_k > 0 or top_p < 1.0) and not greedy
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if temperature <= 0 and not greedy:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}; use greedy=True instead")
    if padding_side_of(prompt_mask) in ("right", "mixed"):
        raise ValueError(
            "sample() needs left-padded prompts: with right padding a short row's next token would be predicted "
            "from a pad position (pitfall S2). Pad prompts on the left (tokenizer.padding_side = 'left')."
        )
    home, device = prompt_ids.device, model_device(model)  # see workbench.core.devices
    prompt_ids, prompt_mask, generator = prompt_ids.to(device), prompt_mask.to(device), generator_on(generator, device)
    if draw not in DRAWS:
        raise ValueError(f"draw={draw!r}; use one of {DRAWS}")
    if engine == "hf" and (truncated or draw != "multinomial" or logprobs_mode != "processed"):
        raise ValueError("top_k/top_p, draw='inverse_cdf' and logprobs_mode='raw' are implemented by engine='workbench' "
                         "only; drop them or use the workbench engine")
    if engine == "hf":
        return _sample_with_generate(
            model, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
            pad_token_id=pad_token_id, temperature=temperature, stop_at_eos=stop_at_eos, greedy=greedy,
            generator=generator,
        ).to(home)
    if engine != "workbench":
        raise ValueError(f"engine={engine!r}; use 'workbench' or 'hf'")
    start = time.perf_counter()
    # inference mode, except for a model sharded by FSDP2: the weights it gathers there would become inference tensors
    # that its later training forwards cannot reuse ("Inplace update to inference tensor outside InferenceMode")
    with torch.no_grad() if any(c.__name__ == "FSDPModule" for c in type(model).__mro__) else torch.inference_mode():
        tokens, logprobs = _sampling_loop(
            model, prompt_ids, prompt_mask, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
            pad_token_id=pad_token_id, temperature=temperature, stop_at_eos=stop_at_eos, greedy=greedy,
            generator=generator, truncated=truncated, top_k=top_k, top_p=top_p, share_prefill=share_prefill,
            static_cache=static_cache, draw=draw, cuda_graph=cuda_graph, raw_logprobs=logprobs_mode == "raw",
        )
    # clones made outside inference mode: ordinary tensors that autograd may use later
    raw_response = torch.stack(tokens, dim=1).clone()
    response_ids, response_mask = truncate_after_eos(raw_response, eos_token_id, pad_token_id)
    rollout_logprobs = zero_masked(torch.stack(logprobs, dim=1).clone(), response_mask)
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        rollout_logprobs=rollout_logprobs,
        finished=torch.isin(response_ids, _stop_ids(eos_token_id, prompt_ids.device)).any(-1),
        decode_steps=len(tokens),
        tokens_generated=len(tokens) * prompt_ids.shape[0],
        seconds=time.perf_counter() - start,
    )
    if observers.listening():  # a workbench.watch sees the sampler's settings, as it sees generate's config
        observers.emit("sample", model=model, temperature=1.0 if greedy else temperature, top_k=top_k, top_p=top_p,
                       stop_ids=_stop_ids(eos_token_id).tolist(), stop_at_eos=stop_at_eos, rollout=rollout)
    return rollout.to(home)


def _inverse_cdf_draw(probs: torch.Tensor, generator) -> torch.Tensor:
    """One token per row by inverse-CDF sampling: one uniform per row against the cumulative sum of the
    probabilities (the first index whose cumulative mass exceeds it). The same distribution as
    ``torch.multinomial``, other draws for the same seed (see module doc)."""
    cumulative = probs.cumsum(-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=probs.dtype) * cumulative[:, -1:]
    return torch.searchsorted(cumulative, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _prefill(model, prompt_ids, attention_mask, position_ids, share: bool):
    """The prompt forward with a cache; with ``share``, once per distinct row, then expanded."""
    repeated = repeated_rows(torch.cat([prompt_ids, attention_mask], dim=1)) if share else None
    if repeated is not None:
        inverse, groups = repeated
        first = torch.tensor([members[0] for members in groups], dtype=torch.long, device=prompt_ids.device)
        output = model(input_ids=prompt_ids[first], attention_mask=attention_mask[first],
                       position_ids=position_ids[first], use_cache=True)
        output.past_key_values.reorder_cache(inverse)
        return output.logits[inverse, -1], output.past_key_values
    output = model(input_ids=prompt_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
    return output.logits[:, -1], output.past_key_values


def _sampling_loop(model, prompt_ids, prompt_mask, *, max_new_tokens, eos_token_id, pad_token_id, temperature,
                   stop_at_eos, greedy, generator, truncated, top_k, top_p, share_prefill, static_cache, draw,
                   cuda_graph=False, raw_logprobs=False):
    """The cached decoding loop: the sampled tokens and their log-probs, one tensor per step."""
    stop_ids = _stop_ids(eos_token_id, prompt_ids.device)
    attention_mask = prompt_mask.clone()
    position_ids = position_ids_from_mask(attention_mask)
    next_position = position_ids[:, -1:] + 1
    decoder = None
    if static_cache and unsupported_reason(model) is None:
        graphed = cuda_graph and max_new_tokens > 1 and capturable(model)
        decoder = (GraphedDecoder if graphed else StaticDecoder)(model, prompt_ids, prompt_mask, position_ids, max_new_tokens - 1,
                                                                 share_prefill=share_prefill)
        last_logits = decoder.first_logits
    else:
        last_logits, cache = _prefill(model, prompt_ids, attention_mask, position_ids, share_prefill)
    finished = torch.zeros(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)
    tokens, logprobs = [], []
    for step in range(max_new_tokens):
        scores = last_logits.float()
        # one reduction instead of an elementwise test: the sum is NaN or ±inf exactly when an entry
        # is (finite logits would have to exceed ~1e33 for the sum to overflow)
        if not torch.isfinite(scores.sum()):
            raise NonFiniteError(
                "the policy's logits contain NaN/inf while sampling; the step was not applied and the last good "
                "checkpoint is kept. Lower the learning rate or check the weights."
            )
        if not greedy and temperature != 1.0:  # (x / 1.0 is x: no pass over the vocabulary for it)
            scores = scores / temperature
        if truncated:
            scores = filter_logits(scores, top_k=top_k, top_p=top_p)
        step_logprobs = F.log_softmax(scores, dim=-1)
        if greedy:
            token = scores.argmax(-1)
        elif draw == "inverse_cdf":
            token = _inverse_cdf_draw(step_logprobs.exp(), generator)
        else:
            token = multinomial_one(step_logprobs.exp(), generator)
        returned = F.log_softmax(last_logits.float(), dim=-1) if raw_logprobs else step_logprobs
        logprob = returned.gather(-1, token[:, None]).squeeze(-1)
        if stop_at_eos:  # a finished row only pads, as generate() does
            token = token.masked_fill(finished, pad_token_id)
        tokens.append(token)
        logprobs.append(logprob)
        finished |= torch.isin(token, stop_ids)
        if (stop_at_eos and bool(finished.all())) or step == max_new_tokens - 1:
            break  # (no forward for a token that is never sampled from)
        if decoder is not None:
            last_logits = decoder.step(token)
            continue
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=1)
        output = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=next_position,
            past_key_values=cache,
            use_cache=True,
        )
        last_logits, cache = output.logits[:, -1], output.past_key_values
        next_position = next_position + 1
    return tokens, logprobs


def _sample_with_generate(
    model, prompt_ids, prompt_mask, *, max_new_tokens, eos_token_id, pad_token_id, temperature, stop_at_eos,
    greedy, generator,
) -> Rollout:
    """The same rollout through ``model.generate`` (which always uses the global RNG)."""
    from transformers import GenerationConfig  # transformers: seconds to import; loaded where a model is

    start = time.perf_counter()
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=1.0 if not greedy else None,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id if stop_at_eos else None,
        pad_token_id=pad_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    saved_eos = model.generation_config.eos_token_id
    # generate() falls back to the model's own eos_token_id when the config passes None.
    model.generation_config.eos_token_id = eos_token_id if stop_at_eos else None
    try:
        with torch.random.fork_rng(devices=[]):
            if generator is not None:
                torch.random.set_rng_state(generator.get_state())
            out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
            if generator is not None:
                generator.set_state(torch.random.get_rng_state())
    finally:
        model.generation_config.eos_token_id = saved_eos
    raw_response = out.sequences[:, prompt_ids.shape[1] :]
    logits = torch.stack(out.logits, dim=1).float()
    if not greedy:
        logits = logits / temperature
    step_logprobs = F.log_softmax(logits, dim=-1).gather(-1, raw_response[..., None]).squeeze(-1)
    response_ids, response_mask = truncate_after_eos(raw_response, eos_token_id, pad_token_id)
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        rollout_logprobs=zero_masked(step_logprobs, response_mask),
        finished=torch.isin(response_ids, _stop_ids(eos_token_id, response_ids.device)).any(-1),
        decode_steps=raw_response.shape[1],
        tokens_generated=raw_response.numel(),
        seconds=time.perf_counter() - start,
    )
