"""Bounded-memory log-probs and entropy (workbench.core.chunked) give the naive path's values and gradients.

The naive path: full logits → ``.float()`` → ``/ τ`` → ``log_softmax`` over the whole vocabulary,
with autograd keeping fp32 copies. The chunked paths (over logits, and the LM head applied chunk by
chunk from the last hidden state) must agree with it to float noise: ≤ 1e-5 in fp32, and in bf16
(the model-dtype logits are the same, the fp32 maths after the upcast is chunked) too; their
gradients agree as well. The memory saving itself is measured by ``benchmarks/run.py``.
"""

import pytest
import torch
import torch.nn.functional as F

from workbench.core.batching import pad_sequences
from workbench.core.chunked import head_logprobs_and_entropy, lm_head_of, logprobs_and_entropy
from workbench.modeling.scoring import entropy_from_logits, forward, logprobs_from_logits, response_logprobs, token_logprobs
from workbench.modeling.tiny import tiny_model

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def naive(logits, labels, temperature=1.0):
    x = logits.float() / temperature
    log_probs = F.log_softmax(x, -1)
    return log_probs.gather(-1, labels[..., None]).squeeze(-1), -(log_probs.exp() * log_probs).sum(-1)


def batch(seed=0, lengths=(5, 17, 9, 30), side="left"):
    g = torch.Generator().manual_seed(seed)
    return pad_sequences([torch.randint(4, 60, (n,), generator=g) for n in lengths], 0, side=side)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [None, 1, 7])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logits_values_and_gradients_equal_the_naive_path(dtype, chunk_size, temperature):
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(3, 11, 300, generator=g) * 4).to(DTYPES[dtype])
    labels = torch.randint(300, (3, 11), generator=g)
    weights = torch.randn(3, 11, generator=g)
    a, b = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    logp, entropy = logprobs_and_entropy(a, labels, temperature, with_entropy=True, chunk_size=chunk_size)
    ref_logp, ref_entropy = naive(b, labels, temperature)
    assert logp.dtype == entropy.dtype == torch.float32
    assert (logp - ref_logp).abs().max() <= 1e-5
    assert (entropy - ref_entropy.detach()).abs().max() <= 1e-5
    (logp * weights).sum().backward()
    (ref_logp * weights).sum().backward()
    assert a.grad.dtype == DTYPES[dtype]
    tolerance = 1e-6 if dtype == "fp32" else 1e-2  # bf16 gradients: one bf16 rounding of the same fp32 value
    assert torch.allclose(a.grad.float(), b.grad.float(), atol=tolerance, rtol=tolerance)
    # the public functions keep their numbers
    assert (logprobs_from_logits(base, labels, temperature, chunk_size=chunk_size) - ref_logp).abs().max() <= 1e-5
    assert (entropy_from_logits(base, temperature, chunk_size=chunk_size) - ref_entropy.detach()).abs().max() <= 1e-5


def test_negative_labels_read_as_token_zero():
    logits = torch.randn(2, 4, 10)
    labels = torch.tensor([[1, -100, 3, 4], [-100, -100, 0, 9]])
    assert torch.equal(logprobs_from_logits(logits, labels), logprobs_from_logits(logits, labels.clamp_min(0)))


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("packed", [False, True])
def test_chunked_head_scoring_equals_full_logits_scoring_with_gradients(arch, dtype, packed):
    """token_logprobs (LM head applied chunk by chunk from the hidden state) vs the full forward's
    logits through the naive maths, in the same layout: values and every parameter's gradient."""
    model, _ = tiny_model(arch, seed=3)
    model = model.to(DTYPES[dtype])
    assert lm_head_of(model) is not None
    ids, mask = batch()
    real = (mask[:, 1:] * mask[:, :-1]).bool()
    weights = torch.randn(real.shape, generator=torch.Generator().manual_seed(2)) * real
    logp, entropy = token_logprobs(model, ids, mask, temperature=0.7, with_entropy=True, packed=packed, chunk_size=5)
    (logp * weights).sum().backward()
    chunked_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref_logp, ref_entropy = naive(forward(model, ids, mask, packed=packed)[:, :-1], ids[:, 1:], 0.7)
    (ref_logp * weights).sum().backward()
    assert (logp - ref_logp)[real].abs().max() <= 1e-5
    assert (entropy - ref_entropy)[real].abs().max() <= 1e-5
    for name, p in model.named_parameters():
        if dtype == "fp32":
            assert torch.allclose(chunked_grads[name], p.grad, atol=1e-5, rtol=1e-4), name
        else:  # bf16: the head's weight gradient is summed per chunk (fp32 accumulator) instead of in one matmul
            scale = float(p.grad.float().abs().max()) + 1e-12
            assert float((chunked_grads[name].float() - p.grad.float()).abs().max()) <= 0.05 * scale, name


def test_response_logprobs_equal_the_slice_of_token_logprobs():
    model, _ = tiny_model("qwen2", seed=4)
    prompt_ids, prompt_mask = batch(5, (3, 6, 4))
    response_ids, response_mask = batch(6, (4, 2, 5), side="right")
    with torch.no_grad():
        whole = token_logprobs(model, torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask], 1))
        part = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask)
    assert part.shape == response_ids.shape
    assert (part - whole[:, prompt_ids.shape[1] - 1 :]).abs().max() <= 1e-6


def test_head_path_only_where_logits_are_exactly_the_head():
    model, _ = tiny_model("qwen2")
    assert lm_head_of(model) is not None
    model.config.final_logit_softcapping = 30.0  # a Gemma-2-style soft cap: full forward instead
    assert lm_head_of(model) is None
    model.config.final_logit_softcapping = None
    model.config.logit_scale = 0.5  # a Cohere-style scale
    assert lm_head_of(model) is None
    wrapper = torch.nn.Module()  # e.g. a DDP wrapper: its forward must be used
    assert lm_head_of(wrapper) is None


def test_head_function_without_bias_and_with_bias():
    g = torch.Generator().manual_seed(7)
    head = torch.nn.Linear(8, 50, bias=True)
    hidden = torch.randn(2, 6, 8, generator=g, requires_grad=True)
    labels = torch.randint(50, (2, 6), generator=g)
    logp, _ = head_logprobs_and_entropy(hidden, head, labels, chunk_size=4)
    logp.sum().backward()
    grads = (hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    hidden.grad = head.weight.grad = head.bias.grad = None
    ref, _ = naive(head(hidden), labels)
    ref.sum().backward()
    assert (logp - ref).abs().max() <= 1e-5
    for mine, theirs in zip(grads, (hidden.grad, head.weight.grad, head.bias.grad), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_bad_chunk_size_is_refused():
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_from_logits(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), chunk_size=0)
