"""The prefix-tree training forward (``scoring.prefix_tree``, ``share_prompts=True``) computes the
padded forward's numbers.

* the layout by hand: one row per group, the prefix once, each suffix continuing its positions,
  a suffix token seeing the prefix and its own suffix only, filler seeing itself;
* DPO: a pair's prompt run once gives the plain per-token log-probs and gradients (qwen2, gpt2),
  and the trainer keeps its step-0 margins exactly 0; attention that cannot take a 4-D boolean
  mask (eager) falls back to the plain forward;
* the sampler's NaN guard (one sum instead of an elementwise test) still stops a poisoned policy;
* GRPO groups score the same shared or padded (realistic checkpoints), and so do response masks with holes (they take
  the padded path: the tree would put them 9.7 nats apart).
"""

import pytest
import torch

from workbench.core.errors import NonFiniteError
from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import prefix_tree, shared_prefix_token_logprobs, token_logprobs
from workbench.modeling.tiny import tiny_model
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.preferences import collate_preferences

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "41"}, {"prompt": "12+34=", "chosen": "46", "rejected": "4"},
         {"prompt": "3*4=", "chosen": "12", "rejected": "7"}, {"prompt": "56-7=", "chosen": "49", "rejected": "509"}]


def test_prefix_tree_layout_by_hand():
    sequences = [[1, 2, 3, 4], [1, 2, 5], [7, 8, 9]]
    ids, positions, visible, where = prefix_tree(sequences, [[0, 1], [2]], [2, 3])
    assert ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 1, 1]]  # filler: the first token of the first row
    assert positions.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 0, 0]]
    assert where == [[0, 1, 2, 3], [0, 1, 4], [5, 6, 7]]
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],
                             [1, 1, 1, 1, 0],
                             [1, 1, 0, 0, 1]], dtype=torch.bool)  # the 2nd suffix never sees the 1st
    assert torch.equal(visible[0, 0], expected)
    assert torch.equal(visible[1, 0], torch.ones(5, 5, dtype=torch.bool).tril())  # one sequence, then filler: causal


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_dpo_shared_prompts_give_the_plain_log_probs_and_gradients(arch):
    model, tokenizer = tiny_model(arch, seed=1)
    model.eval()
    batch = collate_preferences(tokenizer, PAIRS)
    b = batch.num_pairs
    results = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            logp = shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, [[i, i + b] for i in range(b)],
                                                batch.prompt_lengths)
        else:
            logp = token_logprobs(model, batch.input_ids, batch.attention_mask)
        real = batch.attention_mask[:, 1:]
        (logp * real).sum().backward()
        results.append((logp.detach() * real, {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert (results[0][0] - results[1][0]).abs().max() <= 1e-5
    assert results[0][0].abs().sum() > 1  # real log-probs were compared, not zeros
    for name, grad in results[0][1].items():
        assert torch.allclose(grad, results[1][1][name], atol=1e-5, rtol=1e-4), name


def test_dpo_trainer_with_shared_prompts_keeps_step_0_margins_zero_and_the_plain_losses():
    histories = []
    for shared in (False, True):
        model, tokenizer = load("tiny-arith-qwen2")
        config = DPOConfig(steps=3, batch_size=4, progress=False, share_prompts=shared)
        histories.append(DPOTrainer(model, tokenizer, PAIRS, config).train())
    assert histories[1][0]["rewards/margins"] == 0.0
    for plain, shared in zip(*histories, strict=True):
        assert abs(plain["loss"] - shared["loss"]) <= 1e-5
        assert plain["logps/prompt"] == pytest.approx(shared["logps/prompt"], abs=1e-4)
    assert histories[1][-1]["loss"] != histories[1][0]["loss"]  # the updates are real


def test_attention_without_a_boolean_4d_mask_falls_back():
    model, tokenizer = tiny_model("qwen2", attn_implementation="eager")
    batch = collate_preferences(tokenizer, PAIRS[:2])
    assert shared_prefix_token_logprobs(model, batch.input_ids, batch.attention_mask, [[0, 2], [1, 3]],
                                        batch.prompt_lengths) is None


def test_sampler_stops_on_nan_logits():
    model, tokenizer = load("tiny-arith-qwen2")
    with torch.no_grad():
        model.lm_head.weight[5, 0] = float("nan")  # one logit of every position
    ids, mask = torch.tensor([[1, 20, 21]]), torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(NonFiniteError, match="logits contain NaN/inf"):
        sample(model, ids, mask, max_new_tokens=2, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


@pytest.mark.parametrize("name", ["realistic-gpt2", "realistic-qwen2", "realistic-llama"])
def test_grpo_groups_score_the_same_shared_or_padded_on_realistic_checkpoints(name):
    # byte-level BPE prompts of several lengths, 4 samples per prompt as in a GRPO group; absolute
    # positions (GPT-2) and rotary ones (Qwen2, Llama) alike
    from workbench.modeling.scoring import response_logprobs
    from workbench.tasks import encode_prompts, rl_problems

    model, tokenizer = load(name, device="cpu")
    assert not model.training  # the shared path serves models in eval mode only
    prompts = [p.prompt for p in rl_problems(4) for _ in range(4)]
    ids, mask = encode_prompts(tokenizer, prompts)
    rollout = sample(model, ids, mask, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                     generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        padded = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask, share_prompts=False)
        shared = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask, share_prompts=True)
    real = rollout.response_mask.bool()
    assert int(real.sum()) > 16
    assert float((padded - shared)[real].abs().max()) <= 1e-5


def test_response_masks_with_holes_score_as_the_padded_forward():
    # A masked token inside a response (a tool's output kept out of the loss, a hand-built batch) is absent from the
    # padded forward's attention and positions; the tree would run it as a real token, so such batches take the padded
    # path (the sampler never makes them: its masks are real tokens then pads).
    from workbench.modeling.scoring import _scored_shared_prompts, response_extent, response_logprobs
    from workbench.tasks import encode_prompts, rl_problems

    model, tokenizer = load("tiny-arith-qwen2", device="cpu")
    assert not model.training  # the shared path serves models in eval mode only
    prompts = [p.prompt for p in rl_problems(2) for _ in range(3)]
    ids, mask = encode_prompts(tokenizer, prompts)
    responses = torch.randint(3, 20, (len(prompts), 6), generator=torch.Generator().manual_seed(0))
    holes = torch.ones_like(responses)
    holes[0, 2] = 0  # a hole inside the response
    holes[1, 0] = 0  # a response that starts with a masked token
    holes[2, 4:] = 0  # an ordinary right-padded response
    assert response_extent(holes)[:3] == [6, 6, 4]
    with torch.no_grad():
        options = {"temperature": 1.0, "with_entropy": False, "chunk_size": None}
        assert _scored_shared_prompts(model, ids, mask, responses, torch.ones_like(responses), **options) is not None
        assert _scored_shared_prompts(model, ids, mask, responses, holes, **options) is None  # the padded path instead
        padded = response_logprobs(model, ids, mask, responses, holes, share_prompts=False)
        shared = response_logprobs(model, ids, mask, responses, holes, share_prompts=True)
    real = holes.bool()
    assert float((padded - shared)[real].abs().max()) <= 1e-5
