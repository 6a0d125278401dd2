"""The prefix-tree training forward without ``model.model(...)`` (``modeling.inline_body``) computes
transformers' numbers bit for bit, and the scoring paths use it only where it may.

* hidden states and every parameter's gradient are *bitwise* equal to ``model.model(...)``'s on a
  GRPO-shaped and a DPO-shaped prefix tree, Qwen2 (grouped key/value heads) and Llama, fp32 and bf16;
* ``_tree_scored`` gives the same log-probs, entropy and gradients with the inline body as with
  ``model.model(...)`` (forced), bitwise;
* a model in train mode or with a forward hook takes ``model.model(...)``;
* DPO's reference and policy calls on one batch share one prefix tree; a changed batch builds its own.
"""

import pytest
import torch

from workbench.experiments.checkpoints import load
from workbench.modeling import inline_body, scoring
from workbench.modeling.scoring import prefix_tree, shared_prefix_token_logprobs
from workbench.modeling.tiny import tiny_model
from workbench.trainers.preferences import collate_preferences

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "41"}, {"prompt": "12+34=", "chosen": "46", "rejected": "4"},
         {"prompt": "3*4=", "chosen": "12", "rejected": "7"}]


def _model(name, dtype=torch.float32):
    model, tokenizer = load(name) if name == "tiny-arith-qwen2" else tiny_model(name, seed=1)
    return model.to(dtype).eval(), tokenizer


def _trees():
    grpo = prefix_tree([[5, 6, 7, 8, 9], [5, 6, 7, 10], [5, 6, 7, 11, 12, 13], [20, 21, 22], [20, 21, 23, 24]],
                       [[0, 1, 2], [3, 4]], [3, 2])
    dpo = prefix_tree([[1, 2, 3, 4], [1, 2, 5], [7, 8, 9, 10, 11], [7, 8, 12]], [[0, 1], [2, 3]], [2, 2])
    return {"grpo": grpo, "dpo": dpo}


def _hidden_and_grads(model, tree, inline: bool):
    ids, positions, visible, _ = tree
    model.zero_grad(set_to_none=True)
    if inline:
        hidden = inline_body.body_hidden_states(model, ids, visible, positions)
    else:
        hidden = model.model(input_ids=ids, attention_mask=visible, position_ids=positions, use_cache=False).last_hidden_state
    (hidden.float().square().sum() + hidden.float().sum()).backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "llama"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["grpo", "dpo"])
def test_inline_body_is_bitwise_the_model_body(name, dtype, layout):
    model, _ = _model(name, dtype)
    assert inline_body.usable(model)
    tree = _trees()[layout]
    plain, plain_grads = _hidden_and_grads(model, tree, inline=False)
    fast, fast_grads = _hidden_and_grads(model, tree, inline=True)
    assert plain.abs().sum() > 0 and len(plain_grads) == len(list(model.parameters()))
    assert torch.equal(plain, fast)
    assert plain_grads.keys() == fast_grads.keys()
    for key, grad in plain_grads.items():
        assert grad.abs().sum() > 0 or key.endswith("bias"), key
        assert torch.equal(grad, fast_grads[key]), key


def _paired_batch():
    """The tiny Qwen2, a preference batch of ``PAIRS`` and its (chosen, rejected) row groups."""
    model, tokenizer = _model("tiny-arith-qwen2")
    batch = collate_preferences(tokenizer, PAIRS)
    return model, batch, [[i, i + batch.num_pairs] for i in range(batch.num_pairs)]


def test_tree_scored_gives_the_same_logprobs_entropy_and_gradients(monkeypatch):
    model, batch, groups = _paired_batch()
    results = []
    for inline in (True, False):
        monkeypatch.setattr(inline_body, "usable", lambda m, inline=inline: inline)
        scoring._last_shared_prefix_tree[:] = [None, None]
        model.zero_grad(set_to_none=True)
        logp, entropy = shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, groups, batch.prompt_lengths,
                                                     with_entropy=True)
        (logp * batch.attention_mask[:, 1:]).sum().backward()
        results.append((logp.detach(), entropy, [p.grad.clone() for p in model.parameters()]))
    (a, ea, ga), (c, ec, gc) = results
    assert torch.equal(a, c) and torch.equal(ea, ec)
    assert all(torch.equal(x, y) for x, y in zip(ga, gc, strict=True))


def test_train_mode_and_hooks_take_the_model_body():
    model, _ = _model("tiny-arith-qwen2")
    assert inline_body.usable(model)
    model.train()
    assert not inline_body.usable(model)
    model.eval()
    handle = model.model.layers[0].register_forward_hook(lambda *args: None)
    assert not inline_body.usable(model)
    handle.remove()
    gpt2, _ = tiny_model("gpt2", seed=1)
    assert not inline_body.usable(gpt2.eval())
    with pytest.raises(ValueError, match="boolean"):
        ids = torch.tensor([[1, 2, 3]])
        inline_body.body_hidden_states(model, ids, torch.ones(1, 3, dtype=torch.long), torch.arange(3)[None])


def test_reference_and_policy_share_one_prefix_tree(monkeypatch):
    model, batch, groups = _paired_batch()
    tokenizer = load("tiny-arith-qwen2")[1]
    built = []
    original = scoring.prefix_tree
    monkeypatch.setattr(scoring, "prefix_tree", lambda *a, **k: built.append(1) or original(*a, **k))
    scoring._last_shared_prefix_tree[:] = [None, None]
    with torch.no_grad():
        first = shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, groups, batch.prompt_lengths)
    second = shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, groups, batch.prompt_lengths)
    assert len(built) == 1 and torch.equal(first, second.detach())
    batch.input_ids[0, 1] = batch.input_ids[0, 2]  # in place: the version counter moves, the tree is rebuilt
    changed = shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, groups, batch.prompt_lengths)
    assert len(built) == 2 and not torch.equal(changed.detach(), first)
    other = collate_preferences(tokenizer, PAIRS)  # equal values in new tensors: rebuilt (identity, not content)
    shared_prefix_token_logprobs(model, other.input_ids, other.attention_mask, groups, other.prompt_lengths)
    assert len(built) == 3
