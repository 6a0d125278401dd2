"""The graphed decoder's fixed-shape step against the static decoder, and the switch that selects it.

* the fixed-shape step (attention over the whole cache buffer under a mask, the column a device
  tensor), run eagerly on the CPU, gives the static decoder's logits step by step within 1e-5 of
  their scale: padded or not, shared prefill or not, Qwen2 (GQA) and Llama;
* the buffer's future columns are zeroed: NaNs left there by the allocation do not reach the logits;
* ``sample(cuda_graph=True)`` on a CPU model is the static-cache path, bitwise (the switch applies on CUDA only);
* on a CUDA GPU (skipped elsewhere): the replayed graph equals the eager fixed-shape step, and
  ``sample(cuda_graph=True)`` samples the static path's tokens, log-probs within 1e-4 in fp32.
"""

import pytest
import torch

from workbench.core.batching import position_ids_from_mask
from workbench.experiments.checkpoints import load
from workbench.modeling import decode
from workbench.modeling.graphed_decode import GraphedDecoder, capturable
from workbench.modeling.rollout import sample
from workbench.modeling.tiny import tiny_model
from workbench.tasks import encode_prompts, rl_problems

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)
# measured on this project's CPU (AVX-512): ≤ 1.0e-6 of the largest logit (1.2e-5 at |logit| 12, tiny-arith-qwen2), log-probs
# ≤ 2.0e-5; a wrong mask (a zero key attended to) moves them by whole units
RELATIVE_TOLERANCE = 1e-5
LOGPROB_TOLERANCE = 1e-4


def cuda(test):
    """Marked ``gpu`` and skipped without a CUDA device (CI has none; docs/journal/ records the runs)."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


def _model(name, device="cpu"):
    model, tokenizer = load(name) if name == "tiny-arith-qwen2" else tiny_model(name, seed=1)
    return model.to(device).eval(), tokenizer


def _prompts(tokenizer, layout, device="cpu"):
    texts = [p.prompt for p in rl_problems(3)]
    texts = {"padded": texts, "unpadded": [texts[0]] * 3, "groups": [t for t in texts for _ in range(4)]}[layout]
    return (t.to(device) for t in encode_prompts(tokenizer, texts))


def _decoders(model, ids, mask, steps, share=False, capture=False):
    position_ids = position_ids_from_mask(mask)
    plain = decode.StaticDecoder(model, ids, mask, position_ids, steps, share_prefill=share)
    graphed = GraphedDecoder(model, ids, mask, position_ids, steps, share_prefill=share, capture=capture)
    return plain, graphed


@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "llama"])
@pytest.mark.parametrize("layout", ["padded", "unpadded", "groups"])
@pytest.mark.parametrize("share", [False, True])
@torch.inference_mode()
def test_fixed_shape_step_follows_the_static_decoder(name, layout, share):
    model, tokenizer = _model(name)
    ids, mask = _prompts(tokenizer, layout)
    steps = 12
    plain, graphed = _decoders(model, ids, mask, steps, share)
    assert torch.equal(plain.first_logits, graphed.first_logits)  # the same prefill
    generator = torch.Generator().manual_seed(3)
    worst, logits = 0.0, plain.first_logits
    for _ in range(steps):
        token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
        logits, other = plain.step(token), graphed.step(token)
        worst = max(worst, ((logits - other).abs().max() / logits.abs().max().clamp(min=1)).item())
    assert worst <= RELATIVE_TOLERANCE, worst
    assert graphed.get_seq_length() == plain.get_seq_length() == ids.shape[1] + steps
    assert int(graphed._column) == ids.shape[1] + steps


@torch.inference_mode()
def test_unwritten_columns_cannot_reach_the_logits(monkeypatch):
    """The buffers come from ``new_empty``: whatever memory held. The graphed step attends over every column
    (masked), so a NaN left in a future column would turn a row's logits into NaN if it were not zeroed."""
    original = decode.StaticDecoder.__init__

    def poisoned(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for *_, keys, values in self.layers:
            keys[:, :, self.prompt_len :] = float("nan")
            values[:, :, self.prompt_len :] = float("nan")

    monkeypatch.setattr(decode.StaticDecoder, "__init__", poisoned)
    model, tokenizer = _model("tiny-arith-qwen2")
    ids, mask = _prompts(tokenizer, "padded")
    _, graphed = _decoders(model, ids, mask, 4)
    for _ in range(4):
        assert torch.isfinite(graphed.step(torch.zeros(ids.shape[0], dtype=torch.long))).all()


def test_the_switch_is_the_static_path_on_a_cpu():
    model, tokenizer = _model("tiny-arith-qwen2")
    ids, mask = _prompts(tokenizer, "groups")
    assert not capturable(model)
    common = dict(max_new_tokens=10, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  share_prefill=True, static_cache=True)
    a, b = (sample(model, ids, mask, generator=torch.Generator().manual_seed(5), cuda_graph=graph, **common) for graph in (False, True))
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.rollout_logprobs, b.rollout_logprobs)


@cuda
@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "llama"])
@pytest.mark.parametrize("layout", ["padded", "unpadded"])
@torch.inference_mode()
def test_replayed_graph_equals_the_eager_fixed_step(name, layout):
    model, tokenizer = _model(name, "cuda")
    ids, mask = _prompts(tokenizer, layout, "cuda")
    position_ids = position_ids_from_mask(mask)
    eager = GraphedDecoder(model, ids, mask, position_ids, 10, capture=False)
    graphed = GraphedDecoder(model, ids, mask, position_ids, 10, capture=True)
    assert graphed._graph is not None
    token = eager.first_logits.argmax(-1)
    for _ in range(10):
        a, b = eager.step(token), graphed.step(token)
        assert (a - b).abs().max().item() <= 1e-6
        token = a.argmax(-1)


@cuda
@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "llama"])
@pytest.mark.parametrize("layout", ["padded", "unpadded", "groups"])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 16])
def test_graphed_sampling_on_cuda_samples_the_static_tokens(name, layout, max_new_tokens, monkeypatch):
    model, tokenizer = _model(name, "cuda")
    ids, mask = _prompts(tokenizer, layout, "cuda")
    common = dict(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  share_prefill=layout == "groups", static_cache=True)
    recorded = []
    capture = GraphedDecoder._capture
    monkeypatch.setattr(GraphedDecoder, "_capture", lambda self: (recorded.append(self), capture(self)))
    a, b = (sample(model, ids, mask, generator=torch.Generator("cuda").manual_seed(5), cuda_graph=graph, **common)
            for graph in (False, True))
    assert len(recorded) == (max_new_tokens > 1)  # one graph for the graphed call (one token: no decode step to record)
    assert torch.equal(a.response_ids, b.response_ids)
    assert a.decode_steps == b.decode_steps
    assert (a.rollout_logprobs - b.rollout_logprobs).abs().max() <= LOGPROB_TOLERANCE


def test_a_graphed_decoder_needs_a_decode_step():
    model, tokenizer = _model("tiny-arith-qwen2")
    ids, mask = _prompts(tokenizer, "padded")
    with pytest.raises(ValueError, match="max_new_tokens=0: a graphed decoder needs at least one decode step"):
        GraphedDecoder(model, ids, mask, position_ids_from_mask(mask), 0, capture=False)


@cuda
def test_no_graph_under_cuda_autocast():
    """``precision="bf16-mixed"`` samples under CUDA autocast: not verified with graphs, so the static decoder runs."""
    model, _ = _model("tiny-arith-qwen2", "cuda")
    assert capturable(model)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert not capturable(model)
