import pytest
import torch

from workbench.core.errors import ConfigError, PromptMaskError
from workbench.experiments.checkpoints import load
from workbench.pitfalls.nb04_dpo_loss_mask import audit_loss_mask, check_prompt_lengths, margin_decomposition
from workbench.tasks import TRAIN_PREFERENCES, load_preferences
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.preferences import build_loss_mask, collate_preferences

PAIRS = [
    {"prompt": "1+2=", "chosen": "3", "rejected": "4"},
    {"prompt": "12+34=", "chosen": "46", "rejected": "461"},
    {"prompt": "9-99=", "chosen": "-90", "rejected": "-9"},
]


@pytest.fixture(scope="module")
def batch(tokenizer):
    return collate_preferences(tokenizer, PAIRS)


def test_collation_stacks_chosen_on_rejected_right_padded(batch, tokenizer):
    assert batch.input_ids.shape[0] == 6 and batch.prompt_lengths == [5, 7, 6]
    assert tokenizer.decode(batch.input_ids[1][batch.attention_mask[1].bool()]) == "<bos>12+34=46<eos>"
    assert tokenizer.decode(batch.input_ids[4][batch.attention_mask[4].bool()]) == "<bos>12+34=461<eos>"


def test_s4_bug_rejected_rows_count_their_prompt_tokens(batch):
    mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, "chosen_only")
    audit = audit_loss_mask(batch.input_ids, mask, batch.prompt_lengths)
    assert [a["side"] for a in audit] == ["rejected"] * 3
    assert [a["prompt_tokens_in_loss"] for a in audit] == [4, 6, 5]  # prompt targets: all but BOS


def test_s4_fix_no_row_counts_a_prompt_token_and_responses_are_all_kept(batch):
    mask = build_loss_mask(batch.attention_mask, batch.prompt_lengths, "both")
    assert audit_loss_mask(batch.input_ids, mask, batch.prompt_lengths) == []
    # response tokens + EOS of each row: 2, 3, 4 (chosen) and 2, 4, 3 (rejected)
    assert mask.sum(-1).tolist() == [2, 3, 4, 2, 4, 3]


def test_check_prompt_lengths_catches_the_zip_truncation(batch):
    with pytest.raises(PromptMaskError, match="prompt_lengths \\* 2"):
        check_prompt_lengths(6, batch.prompt_lengths)
    check_prompt_lengths(6, batch.prompt_lengths * 2)


def test_margin_decomposition_is_exact_and_zero_at_step0(batch):
    policy, _ = load("tiny-arith-qwen2")
    reference, _ = load("tiny-arith-qwen2")
    step0 = margin_decomposition(policy, reference, batch, beta=0.1)
    assert float(step0["margin_chosen_only"].abs().max()) == 0.0
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    moved = margin_decomposition(policy, reference, batch, beta=0.1)
    gap = moved["margin_chosen_only"] - moved["margin_both"]
    assert float(gap.abs().max()) > 1e-3
    torch.testing.assert_close(gap, moved["rejected_prompt_term"], atol=1e-5, rtol=0)


def train(mode, steps=30, **kw):
    policy, tokenizer = load("tiny-arith-qwen2")
    config = DPOConfig(steps=steps, prompt_mask=mode, progress=False, **kw)
    return DPOTrainer(policy, tokenizer, load_preferences(TRAIN_PREFERENCES)[:512], config).train()


def test_s4_bug_inflates_accuracy_and_pushes_the_prompt_down():
    bug, fix = train("chosen_only"), train("both")
    assert bug[-1]["prompt_tokens_in_loss/rejected"] > 0 == fix[-1]["prompt_tokens_in_loss/rejected"]
    assert bug[-1]["rewards/margins"] > 3 * fix[-1]["rewards/margins"]
    bug_drift = bug[-1]["logps/prompt"] - bug[0]["logps/prompt"]
    fix_drift = fix[-1]["logps/prompt"] - fix[0]["logps/prompt"]
    assert bug_drift < 3 * fix_drift < 0


def test_none_and_both_give_the_same_training():
    both, none = train("both", steps=5), train("none", steps=5)
    for a, b in zip(both, none, strict=False):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_dpo_raises_the_reward_accuracy():
    history = train("both", steps=60)
    first = sum(h["rewards/accuracies"] for h in history[1:11]) / 10  # step 0: margins are exactly 0
    last = sum(h["rewards/accuracies"] for h in history[-10:]) / 10
    assert last > first + 0.05, (first, last)
    assert history[0]["rewards/margins"] == 0.0 and history[0]["loss"] == pytest.approx(0.6931, abs=1e-4)


def test_precomputed_reference_matches_the_live_copy():
    live = train("both", steps=3)
    pre = train("both", steps=3, reference="precomputed")
    for a, b in zip(live, pre, strict=False):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)


@pytest.mark.parametrize(
    "field, value, message",
    [("beta", 0.0, "beta=0.0 must be > 0"), ("loss_type", "kto", "is not one of"),
     ("prompt_mask", "rejected_only", "is not one of"), ("label_smoothing", 0.7, "label_smoothing")],
)
def test_invalid_config_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        DPOConfig(**{field: value})


def test_empty_dataset_is_a_clear_error():
    policy, tokenizer = load("tiny-qwen2")
    with pytest.raises(ValueError, match="empty preference dataset"):
        DPOTrainer(policy, tokenizer, [], DPOConfig())
