"""``WatchCallback(dump_rollouts=DIR)``: a TRL GRPOTrainer's generation batches written as generic dump records."""

import os
import tempfile
from types import SimpleNamespace

import pytest
import torch

from workbench.core.rollout_dump import DumpError, read_dump
from workbench.watch import WatchCallback


def fake_trainer(rewards_logged):
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    return SimpleNamespace(eos_token_ids=[2], processing_class=tokenizer, num_generations=2, temperature=0.7,
                           state=SimpleNamespace(global_step=5), reward_weights=torch.tensor([1.0, 0.5]),
                           _logs={"rewards": {"f": [9.0] + rewards_logged[0], "g": rewards_logged[1]}})


OUTPUT = {"prompt_ids": torch.tensor([[0, 4, 5], [6, 7, 8]]), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
          "completion_ids": torch.tensor([[3, 2, 0], [3, 3, 3]]), "completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
          "old_per_token_logps": torch.tensor([[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]])}


def test_batch_records_cut_at_the_eos_and_weigh_the_logged_rewards():
    records = WatchCallback.batch_records(fake_trainer([[1.0, 0.0], [2.0, 4.0]]), OUTPUT)
    first, second = records
    assert first["prompt_ids"] == [4, 5] and first["response_ids"] == [3, 2] and first["finish"] == "stop"
    assert second["response_ids"] == [3, 3, 3] and second["finish"] == "length" and second["loss_mask"] == [1, 1, 1]
    assert [r["reward"] for r in records] == [1.0 + 0.5 * 2.0, 0.0 + 0.5 * 4.0]  # the last two logged, weighted
    assert first["trainer_logprobs"] == [-0.5, -0.25] and first["rollout_logprobs"] is None
    assert [r["group"] for r in records] == [0, 0] and first["step"] == first["policy_version"] == 5
    assert first["temperature"] == pytest.approx(0.7)
    assert WatchCallback.batch_records(fake_trainer([[], []]), OUTPUT) is None  # rewards not logged: nothing made up


def test_a_dump_folder_that_cannot_be_made_is_refused_at_once(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DumpError, match="a file is there, not a folder"):
        WatchCallback(dump_rollouts=str(tmp_path / "a-file"))


@pytest.mark.slow
def test_a_trl_grpo_step_is_dumped_with_its_rewards(tmp_path):
    pytest.importorskip("trl")
    from datasets import Dataset  # datasets, trl: optional (the peers extra)
    from trl import GRPOConfig, GRPOTrainer

    from workbench.modeling.tiny import tiny_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model, tokenizer = tiny_model("llama", seed=1)
    callback = WatchCallback(write_report=False, dump_rollouts=str(tmp_path))
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="watch-dump-"), per_device_train_batch_size=8, num_generations=2,
                      max_completion_length=6, beta=0.0, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                      max_steps=1)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=args,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in ["1+2=", "12+34=", "3*4=", "567-8="]] * 4),
                          processing_class=tokenizer, callbacks=[callback])
    trainer.train()
    records = list(read_dump(tmp_path))
    assert len(records) == 8 and [r["group"] for r in records] == [0, 0, 1, 1, 2, 2, 3, 3]
    for r in records:  # the reward function saw the decoded completion: its length is the record's reward
        assert r["reward"] == float(len(tokenizer.decode(r["response_ids"], skip_special_tokens=True)))
        assert len(r["loss_mask"]) == len(r["response_ids"]) <= 6 and r["step"] == 0
