import torch

from workbench.core.batching import pad_sequences, padding_side_of, position_ids_from_mask, repad, unpad
from workbench.modeling.rollout import sample, truncate_after_eos
from workbench.modeling.tiny import tiny_model
from workbench.tasks import encode_prompts


def test_position_ids_from_mask_counts_real_tokens_on_either_side():
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 0, 0]])
    assert position_ids_from_mask(left).tolist() == [[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert position_ids_from_mask(right).tolist() == [[0, 1, 2, 1, 1]]


def test_pad_sequences_and_padding_side():
    ids, mask = pad_sequences([[5, 6, 7], [8]], pad_token_id=0, side="left")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and padding_side_of(mask) == "left"
    ids_r, mask_r = repad(ids, mask, 0, "right")
    assert ids_r.tolist() == [[5, 6, 7], [8, 0, 0]] and padding_side_of(mask_r) == "right"
    assert [r.tolist() for r in unpad(ids_r, mask_r)] == [[5, 6, 7], [8]]
    assert padding_side_of(torch.ones(2, 3)) == "none"
    assert padding_side_of(torch.tensor([[0, 1, 0]])) == "mixed"


def test_truncate_after_eos_keeps_eos_masks_the_rest_and_keeps_truncated_rows():
    eos, pad = 2, 0
    response = torch.tensor([[7, 2, 9, 2], [7, 8, 9, 9], [2, 5, 5, 5]])
    ids, mask = truncate_after_eos(response, eos, pad)
    assert ids.tolist() == [[7, 2, 0, 0], [7, 8, 9, 9], [2, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    ids, mask = truncate_after_eos(response, [9, 2], pad)  # custom stop tokens
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]


def _trained():
    from workbench.experiments.checkpoints import load

    return load("tiny-arith-qwen2")


def test_stopping_at_eos_samples_the_same_responses_with_fewer_steps():
    model, tokenizer = _trained()
    ids, mask = encode_prompts(tokenizer, ["12+7=", "3*4=", "88-19=", "5+5="] * 4)
    kw = dict(max_new_tokens=12, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    fix = sample(model, ids, mask, stop_at_eos=True, generator=torch.Generator().manual_seed(0), **kw)
    bug = sample(model, ids, mask, stop_at_eos=False, generator=torch.Generator().manual_seed(0), **kw)
    assert bug.decode_steps == 12 and fix.decode_steps < 12
    assert bug.tokens_generated > fix.tokens_generated
    width = fix.response_ids.shape[1]
    assert torch.equal(fix.response_ids, bug.response_ids[:, :width])
    assert torch.equal(fix.response_mask, bug.response_mask[:, :width])
    assert bug.response_mask[:, width:].sum() == 0
    torch.testing.assert_close(fix.rollout_logprobs, bug.rollout_logprobs[:, :width])


def test_hf_generate_engine_samples_the_same_tokens():
    model, tokenizer = _trained()
    ids, mask = encode_prompts(tokenizer, ["12+7=", "3*4=", "88-19="])
    kw = dict(max_new_tokens=6, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, temperature=0.9)
    ours = sample(model, ids, mask, generator=torch.Generator().manual_seed(5), **kw)
    hf = sample(model, ids, mask, generator=torch.Generator().manual_seed(5), engine="hf", **kw)
    assert torch.equal(ours.response_ids, hf.response_ids)
    torch.testing.assert_close(ours.rollout_logprobs, hf.rollout_logprobs, atol=1e-5, rtol=0)


def test_rollout_logprobs_match_a_training_forward_with_mask_positions():
    from workbench.modeling.scoring import response_logprobs

    model, tokenizer = tiny_model("gpt2")
    ids, mask = encode_prompts(tokenizer, ["12+7=", "3*4=", "88-19=", "5+5="])
    rollout = sample(model, ids, mask, max_new_tokens=5, eos_token_id=2, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    logp = response_logprobs(model, ids, mask, rollout.response_ids, rollout.response_mask, position_ids="mask")
    torch.testing.assert_close(logp * rollout.response_mask, rollout.rollout_logprobs, atol=1e-5, rtol=0)
