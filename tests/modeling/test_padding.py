"""S2: the padding guard, the cached-generation hazard, packing/unpacking and packed scoring."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.core.batching import pack_sequences, pad_sequences, unpack_token_values
from workbench.core.errors import RightPaddingError
from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import logprobs_from_logits, token_logprobs
from workbench.modeling.tiny import ARCHITECTURES, tiny_model
from workbench.pitfalls.nb02_right_padding_flash_attention import assert_not_right_padded, generation_divergence, padding_guard
from workbench.tasks import encode_prompts, rl_problems

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)


def test_guard_reproduces_the_transformers_check():
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    right = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert not padding_guard(left, use_cache=True).right_padded
    report = padding_guard(right, use_cache=True)
    assert report.right_padded and report.rows_ending_in_padding == [0]
    assert report.would_raise_in_transformers_4_37_to_4_41
    assert not padding_guard(right, use_cache=False).would_raise_in_transformers_4_37_to_4_41
    assert not padding_guard(right, use_cache=True, attn_implementation="sdpa").would_raise_in_transformers_4_37_to_4_41
    with pytest.raises(RightPaddingError, match="padding_side='right'"):
        assert_not_right_padded(right)
    assert_not_right_padded(left)


def test_ppo_post_eos_masks_are_right_padded_and_flagged():
    model, tokenizer = load("tiny-arith-qwen2")
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in rl_problems(16)])
    rollout = sample(model, ids, mask, max_new_tokens=8, eos_token_id=2, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    assert padding_guard(rollout.sequences()[1], use_cache=True).would_raise_in_transformers_4_37_to_4_41


def test_sampler_refuses_right_padded_prompts(tokenizer):
    model, _ = tiny_model("qwen2")
    ids, mask = pad_sequences([[1, 5, 6, 7], [1, 5]], 0, side="right")
    with pytest.raises(ValueError, match="left-padded"):
        sample(model, ids, mask, max_new_tokens=2, eos_token_id=2, pad_token_id=0)


@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "tiny-arith-gpt2"])
def test_right_padded_cached_generation_diverges_left_padded_does_not(name):
    model, tokenizer = load(name)
    result = generation_divergence(model, tokenizer, [p.prompt for p in rl_problems(24)])
    assert result["right_divergent_rows"] > 0
    assert result["left_divergent_rows"] == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(4, 63), min_size=1, max_size=12), min_size=1, max_size=6))
def test_pack_unpack_round_trip_and_targets_never_cross_a_boundary(sequences):
    batch = pack_sequences(sequences)
    assert batch.lengths == [len(s) for s in sequences]
    assert [p.tolist() for p in unpack_token_values(batch.input_ids, batch.lengths)] == sequences
    for seq, positions, targets in zip(sequences, unpack_token_values(batch.position_ids, batch.lengths),
                                       unpack_token_values(batch.targets, batch.lengths), strict=False):
        assert positions.tolist() == list(range(len(seq)))
        assert targets.tolist() == seq[1:] + [-100]


def _alone(model, sequences):
    return [logprobs_from_logits(model(input_ids=torch.tensor([s])).logits[0, :-1], torch.tensor(s[1:])) for s in sequences]


SEQUENCES = [[1, 5, 6, 7, 8, 2], [1, 9, 10, 2], [1, 11, 12, 13, 14, 15, 16, 17, 2], [1, 20, 2]]


def _packed(model, sequences, use_cache: bool):
    """Per-sequence log-probs from one packed forward (with or without the cache)."""
    batch = pack_sequences(sequences)
    logp = logprobs_from_logits(model(**{**batch.model_inputs(), "use_cache": use_cache}).logits[0], batch.targets[0])
    return unpack_token_values(logp, batch.lengths)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_packed_scoring_equals_scoring_each_sequence_alone(arch):
    model, _ = tiny_model(arch)
    with torch.no_grad():
        alone = _alone(model, SEQUENCES)
        for a, p in zip(alone, _packed(model, SEQUENCES, use_cache=False), strict=True):
            torch.testing.assert_close(p[:-1], a, atol=1e-5, rtol=0)
        # the same through the padded-layout API, left and right padding
        for side in ("left", "right"):
            ids, mask = pad_sequences(SEQUENCES, 0, side=side)
            padded = token_logprobs(model, ids, mask)
            packed = token_logprobs(model, ids, mask, packed=True)
            targets = (mask[:, 1:] & mask[:, :-1]).bool()
            torch.testing.assert_close(packed[targets], padded[targets], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_packing_with_the_cache_on_is_wrong(arch):
    model, _ = tiny_model(arch)
    with torch.no_grad():
        alone = _alone(model, SEQUENCES)
        worst = max(float((a - p[:-1]).abs().max()) for a, p in zip(alone, _packed(model, SEQUENCES, use_cache=True), strict=True))
    assert worst > 1e-2


def test_rolling_labels_on_the_packed_row_leaks_across_boundaries():
    batch = pack_sequences(SEQUENCES)
    rolled = torch.roll(batch.input_ids[0], -1)
    ends = torch.tensor(batch.lengths).cumsum(0)[:-1] - 1
    # at each sequence end the rolled label is the next sequence's first token, not "no target"
    assert (rolled[ends] == 1).all() and (batch.targets[0][ends] == -100).all()


@pytest.mark.parametrize("trainer", ["ppo", "grpo", "dpo"])
def test_trainers_give_the_same_losses_packed_and_padded(trainer):
    from workbench.tasks import TRAIN_PREFERENCES, load_preferences
    from workbench.trainers.dpo import DPOConfig, DPOTrainer
    from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
    from workbench.trainers.ppo import PPOConfig, PPOTrainer

    cls, config_cls, data, keys = {
        "ppo": (PPOTrainer, PPOConfig, rl_problems(32), ("policy_loss", "value_loss", "kl")),
        "grpo": (GRPOTrainer, GRPOConfig, rl_problems(32), ("loss", "entropy")),
        "dpo": (DPOTrainer, DPOConfig, load_preferences(TRAIN_PREFERENCES)[:64], ("loss", "rewards/margins")),
    }[trainer]
    histories = {}
    for packed in (False, True):
        model, tokenizer = load("tiny-arith-gpt2")
        size = {"prompts_per_step": 8} if trainer == "ppo" else {}  # PPO's default 32 prompts × 2 epochs × 2 mini-batches: 4× the time
        histories[packed] = cls(model, tokenizer, data, config_cls(steps=2, progress=False, packed=packed, **size)).train()
    for a, b in zip(histories[False], histories[True], strict=False):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
