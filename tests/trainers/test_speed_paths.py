"""The trainers' speed paths give the numbers of the plain paths.

* the sampler under inference mode returns ordinary tensors and makes no forward pass for a token
  it never samples from; ``share_prefill`` (one prompt forward per distinct prompt) samples the
  same tokens for the same seed;
* ``share_prompts`` (a group's prompt run once in the training forward, prefix-tree rows, each response
  cut after its last real token) gives the plain path's log-probs and gradients at every real token and 0
  after a row's last one (an empty response included), and GRPO with it keeps ρ = 1 and KL = 0 at step 0 (fp32
  and bf16);
* a group's prompt is tokenised once; DPO's per-pair token cache builds the same batches.
"""

from pathlib import Path

import pytest
import torch

from workbench.core.batching import pad_sequences
from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_extent, response_logprobs
from workbench.modeling.tiny import tiny_model
from workbench.tasks import Problem, encode_prompts, rl_problems
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.preferences import collate_encoded, collate_preferences

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

RAGGED = [Problem("1+2=", "3"), Problem("12+34=", "46"), Problem("3*4=", "12"), Problem("56-7=", "49")]


def group_prompts(tokenizer, groups=3, size=4):
    return encode_prompts(tokenizer, [p.prompt for p in rl_problems(groups) for _ in range(size)])


def test_sampler_returns_ordinary_tensors_and_skips_the_unused_last_forward():
    model, tokenizer = load("tiny-arith-qwen2")
    ids, mask = group_prompts(tokenizer)
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    try:
        r = sample(model, ids, mask, max_new_tokens=3, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                   stop_at_eos=False, generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    assert r.decode_steps == 3 and len(calls) == 3  # prefill + 2 decode forwards (the 3rd token needs none)
    assert not r.response_ids.is_inference() and not r.rollout_logprobs.is_inference()


@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "tiny-arith-gpt2"])
def test_shared_prefill_samples_the_same_tokens(name):
    model, tokenizer = load(name)
    ids, mask = group_prompts(tokenizer)
    rollouts = [sample(model, ids, mask, max_new_tokens=8, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(3), share_prefill=share)
                for share in (False, True)]
    assert torch.equal(rollouts[0].response_ids, rollouts[1].response_ids)
    assert (rollouts[0].rollout_logprobs - rollouts[1].rollout_logprobs).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_shared_prompts_give_the_plain_log_probs_and_gradients(arch):
    model, _ = tiny_model(arch, seed=2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 60, (n,), generator=g) for n in (3, 7, 5)]
    prompt_ids, prompt_mask = pad_sequences([p for p in prompts for _ in range(4)], 0, side="left")
    lengths = (1, 4, 6, 2, 3, 3, 5, 6, 2, 1, 1, 6)
    response_ids, response_mask = pad_sequences([torch.randint(4, 60, (n,), generator=g) for n in lengths], 0, side="right")
    results = []
    for share in (False, True):
        model.zero_grad()
        logp, entropy = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=0.7,
                                          with_entropy=True, share_prompts=share)
        (logp * response_mask).sum().backward()
        results.append((logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters()}))
    real = response_mask.bool()
    assert (results[0][0] - results[1][0])[real].abs().max() <= 1e-5
    assert (results[0][1] - results[1][1])[real].abs().max() <= 1e-5
    # the pads after each response's last token are not run on the shared path: 0 there (the padded path scores them)
    assert torch.equal(results[1][0][~real], torch.zeros(int((~real).sum()))) and bool(results[0][0][~real].ne(0).all())
    assert torch.equal(results[1][1][~real], torch.zeros(int((~real).sum())))
    for name, grad in results[0][2].items():
        assert torch.allclose(grad, results[1][2][name], atol=1e-5, rtol=1e-4), name


def test_response_extent_keeps_every_position_up_to_the_last_real_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert response_extent(mask) == [2, 3, 0, 4]  # a hole before the last real token is kept
    assert response_extent(mask[:, :0]) == [0, 0, 0, 0]  # no response column at all


def test_shared_prompts_score_an_empty_response_and_a_full_one_like_the_padded_path():
    model, _ = tiny_model("qwen2", seed=3)
    g = torch.Generator().manual_seed(1)
    prompt_ids, prompt_mask = pad_sequences([p for p in (torch.randint(4, 60, (n,), generator=g) for n in (4, 6)) for _ in range(3)],
                                            0, side="left")
    response_ids = torch.randint(4, 60, (6, 5), generator=g)
    response_mask = (torch.arange(5) < torch.tensor([3, 0, 5, 2, 4, 1])[:, None]).long()  # as the sampler masks: up to EOS
    with torch.no_grad():
        padded, shared = (response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, share_prompts=share)
                          for share in (False, True))
    real = response_mask.bool()
    assert float((padded - shared)[real].abs().max()) <= 1e-5 and int(real.sum()) == 15
    assert bool(shared[~real].eq(0).all()) and bool(padded[~real].ne(0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grpo_with_shared_prompts_keeps_ratio_one_and_kl_zero_at_step_0(dtype):
    model, tokenizer = load("tiny-arith-qwen2")
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=4, num_generations=2, max_new_tokens=4, beta=0.1,
                        mini_batches=2, num_iterations=2, share_prompts=True)
    step = GRPOTrainer(model.to(dtype), tokenizer, RAGGED, config).train()[0]
    assert step["ratio_deviation_first"] == 0.0 and step["kl_first"] == 0.0 and step["clip_fraction_first"] == 0.0
    assert step["ratio_deviation_later"] > 0  # the update is real


def test_group_prompts_are_encoded_like_every_row():
    model, tokenizer = load("tiny-arith-qwen2")
    trainer = GRPOTrainer(model, tokenizer, RAGGED, GRPOConfig(steps=1, progress=False, prompts_per_step=3, num_generations=2))
    problems, rollout = trainer.sample_rollout(0, repeats=2)
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in problems])
    assert torch.equal(rollout.prompt_ids, ids) and torch.equal(rollout.prompt_mask, mask)


def test_dpo_token_cache_builds_the_same_batches():
    model, tokenizer = load("tiny-arith-qwen2")
    pairs = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+34=", "chosen": "46", "rejected": "406"},
             {"prompt": "3*4=", "chosen": "12", "rejected": "7"}]
    trainer = DPOTrainer(model, tokenizer, pairs, DPOConfig(steps=3, batch_size=2, progress=False))
    trainer.train()
    for step in range(3):
        indices = trainer.batch_indices(step)
        expected = collate_preferences(tokenizer, [pairs[i] for i in indices])
        cached = collate_encoded([trainer._encoded[i] for i in indices], tokenizer.pad_token_id)
        assert torch.equal(cached.input_ids, expected.input_ids) and cached.prompt_lengths == expected.prompt_lengths


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_batched_pair_encoding_equals_one_pair_at_a_time(tokenizer, which):
    """``encode_pairs`` (three batched tokenizer calls) gives every pair the ids three calls of its own give it."""
    from transformers import PreTrainedTokenizerFast

    from workbench.tasks import TRAIN_PREFERENCES, load_preferences
    from workbench.trainers.preferences import encode_pairs

    def one_pair(pair):  # <bos> prompt response <eos>, one tokenizer call per text
        prompt, eos = tokenizer(pair["prompt"])["input_ids"], [tokenizer.eos_token_id]
        return (prompt, prompt + tokenizer(pair["chosen"], add_special_tokens=False)["input_ids"] + eos,
                prompt + tokenizer(pair["rejected"], add_special_tokens=False)["input_ids"] + eos)

    if which == "bpe":  # the shipped byte-level BPE (data/tokenizer), a realistic tokenizer with merges
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(Path(__file__).resolve().parents[2] / "data" / "tokenizer"))
    pairs = load_preferences(TRAIN_PREFERENCES)[:200] + [{"prompt": "", "chosen": "", "rejected": " 7"}]
    assert encode_pairs(tokenizer, pairs) == [one_pair(p) for p in pairs]
    assert encode_pairs(tokenizer, []) == []
