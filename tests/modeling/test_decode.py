"""The sampler's static-cache decode path and its inverse-CDF draw against the plain paths.

* ``static_cache=True`` (``modeling.decode.StaticDecoder``) samples the tokens ``model(...)``
  samples for the same seed, log-probs within 1e-5, padded or not, with or without the shared
  prefill, on Qwen2 (GQA) and Llama; its logits step by step equal ``model(...)``'s within 1e-5;
* models it does not run (GPT-2, eager attention, forward hooks) take ``model(...)``;
* ``draw="inverse_cdf"`` draws tokens with the frequencies of the probabilities and never a token
  the top-k filter removed;
* ``_rms_norm`` (the decoder's and the inline training body's) is the model's RMSNorm bitwise, values and gradients.
"""

import pytest
import torch
import torch.nn.functional as F

from workbench.core.batching import position_ids_from_mask
from workbench.experiments.checkpoints import load
from workbench.modeling.decode import StaticDecoder, _head_chunks, _rms_norm, unsupported_reason
from workbench.modeling.rollout import _inverse_cdf_draw, sample
from workbench.modeling.tiny import tiny_model
from workbench.tasks import encode_prompts, rl_problems

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)


def _model(name):
    if name == "tiny-arith-qwen2":
        model, tokenizer = load(name)
    else:
        model, tokenizer = tiny_model(name, seed=1)
    return model.eval(), tokenizer


def _prompts(tokenizer, layout):
    texts = [p.prompt for p in rl_problems(3)]
    texts = {"padded": texts, "unpadded": [texts[0]] * 3, "groups": [t for t in texts for _ in range(4)]}[layout]
    return encode_prompts(tokenizer, texts)


@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "llama"])
@pytest.mark.parametrize("layout", ["padded", "unpadded", "groups"])
@pytest.mark.parametrize("share", [False, True])
def test_static_cache_samples_the_plain_tokens(name, layout, share):
    model, tokenizer = _model(name)
    ids, mask = _prompts(tokenizer, layout)
    rollouts = [sample(model, ids, mask, max_new_tokens=10, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       generator=torch.Generator().manual_seed(5), share_prefill=share, static_cache=static) for static in (False, True)]
    assert torch.equal(rollouts[0].response_ids, rollouts[1].response_ids)
    assert rollouts[0].decode_steps == rollouts[1].decode_steps
    assert (rollouts[0].rollout_logprobs - rollouts[1].rollout_logprobs).abs().max() <= 1e-5


@pytest.fixture
def one_thread():
    """The chunked LM head runs on one torch thread only (decode._head_chunks)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("layout", ["padded", "unpadded"])
@pytest.mark.parametrize("vocab", [300, 9000])  # 9000: the LM head in chunks of its rows (decode._head_chunks)
def test_static_decoder_logits_follow_the_model_step_by_step(layout, vocab):
    model, tokenizer = tiny_model("qwen2", seed=3, vocab_size=vocab)
    model.eval()
    ids, mask = _prompts(tokenizer, layout)
    positions = position_ids_from_mask(mask)
    tokens = torch.randint(4, vocab, (5, ids.shape[0]), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        decoder = StaticDecoder(model, ids, mask, positions, max_new_tokens=5)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        assert (decoder.first_logits - out.logits[:, -1]).abs().max() <= 1e-5
        cache, attention, position = out.past_key_values, mask, positions[:, -1:] + 1
        for token in tokens:
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
            expected = model(input_ids=token[:, None], attention_mask=attention, position_ids=position, past_key_values=cache,
                             use_cache=True).logits[:, -1]
            position = position + 1
            assert (decoder.step(token) - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("hidden", [256, 896])
def test_chunked_lm_head_matches_the_plain_one(rows, hidden, one_thread):
    """Bitwise equal on the CPUs it was measured on (AVX-512 and AVX2, MKL, one thread), so the sampler draws the same
    tokens there; other kernels may sum the dot products in another order, so the test asks 1e-5 relative to the
    logits' scale (a different shape is a different kernel: no exact comparison across machines)."""
    generator = torch.Generator().manual_seed(rows * hidden)
    weight, bias = torch.randn(32000, hidden, generator=generator) * 0.02, torch.randn(32000, generator=generator)
    x = torch.randn(rows, hidden, generator=generator)
    for b in (None, bias):
        chunks = _head_chunks(weight, b)
        assert len(chunks) == 63
        plain = F.linear(x, weight, b)
        chunked = torch.cat([F.linear(x, *chunk) for chunk in chunks], dim=-1)
        assert (chunked - plain).abs().max() <= 1e-5 * plain.abs().max()
    assert _head_chunks(weight[:300], None) is None  # a small vocabulary: one matmul


def test_unsupported_models_take_the_model_forward():
    assert "GPT2" in unsupported_reason(tiny_model("gpt2")[0])
    eager, _ = tiny_model("qwen2", attn_implementation="eager")
    assert "eager" in unsupported_reason(eager)
    model, tokenizer = _model("tiny-arith-qwen2")
    assert unsupported_reason(model) is None
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        assert "hooks" in unsupported_reason(model)
        ids, mask = _prompts(tokenizer, "padded")
        r = sample(model, ids, mask, max_new_tokens=3, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                   stop_at_eos=False, generator=torch.Generator().manual_seed(0), static_cache=True)
    finally:
        handle.remove()
    assert r.decode_steps == 3 and len(calls) == 3  # the hooked model ran through model(...): prefill + 2 decode forwards


def test_inverse_cdf_draws_follow_the_probabilities():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2], [0.0, 0.0, 0.0, 1.0]]).repeat(2000, 1)
    tokens = _inverse_cdf_draw(probs, torch.Generator().manual_seed(0)).view(2000, 2)
    assert set(tokens[:, 1].tolist()) == {3}
    frequencies = torch.bincount(tokens[:, 0], minlength=4).float() / 2000
    # binomial standard error ≤ 0.0112 at n = 2000: 4 of them
    assert (frequencies - probs[0]).abs().max() <= 0.045 and frequencies[1] == 0


def test_inverse_cdf_sampling_respects_top_k():
    model, tokenizer = _model("tiny-arith-qwen2")
    ids, mask = _prompts(tokenizer, "groups")
    r = sample(model, ids, mask, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
               generator=torch.Generator().manual_seed(1), top_k=1, draw="inverse_cdf", static_cache=True)
    greedy = sample(model, ids, mask, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                    greedy=True)
    assert torch.equal(r.response_ids, greedy.response_ids)  # top-1 leaves one token: the draw must take it
    with pytest.raises(ValueError, match="draw"):
        sample(model, ids, mask, max_new_tokens=2, eos_token_id=2, pad_token_id=0, draw="gumbel")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(16, 1, 96), (2, 37, 896)])
def test_rms_norm_is_the_models_bitwise(dtype, shape):
    """float32 takes F.rms_norm, whose CPU kernel is a C++ composite of the same ATen ops in the same order as the
    model's Python (not a fused kernel): equal bits on any CPU, gradients too; bfloat16 takes the op-for-op path."""
    model, _ = tiny_model("qwen2", seed=1, hidden_size=shape[-1], num_attention_heads=4, num_key_value_heads=2)
    norm = model.model.layers[0].input_layernorm.to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(shape[-1], generator=torch.Generator().manual_seed(1)) + 0.5)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    ours_in, theirs_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours, theirs = _rms_norm(norm, ours_in), norm(theirs_in)
    assert ours.dtype == theirs.dtype == dtype and torch.equal(ours, theirs)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    ours_grads = torch.autograd.grad(ours, [ours_in, norm.weight], grad)
    theirs_grads = torch.autograd.grad(theirs, [theirs_in, norm.weight], grad)
    assert all(torch.equal(a, b) for a, b in zip(ours_grads, theirs_grads, strict=True))
