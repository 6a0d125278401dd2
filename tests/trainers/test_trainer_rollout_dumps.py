"""``dump_rollouts``: GRPO and PPO write each step's responses as generic dump records equal to the step's tensors.
One GRPO run in the default suite (the stale sampler: versions, the gap, every field); the rest are slow."""

import pytest
import torch

from workbench.core.errors import ConfigError
from workbench.core.rollout_dump import read_dump
from workbench.experiments.checkpoints import load
from workbench.tasks import rl_problems
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer

SMALL = {"progress": False, "prompts_per_step": 2, "max_new_tokens": 4}


def dumped(trainer_cls, config):
    """Train; return the dump's records and each ``dump_step`` call's tensors."""
    model, tokenizer = load("tiny-arith-qwen2")
    trainer = trainer_cls(model, tokenizer, rl_problems(16), config)
    calls, dump_step = [], trainer.dump_step

    def recording(step, rollout, **tensors):
        calls.append((step, rollout, tensors))
        dump_step(step, rollout, **tensors)

    trainer.dump_step = recording
    trainer.train()
    return list(read_dump(config.dump_rollouts)), calls


def test_grpo_records_equal_the_step_tensors_and_stale_weights_show_in_the_version(tmp_path):
    config = GRPOConfig(steps=3, num_generations=3, rollout_staleness=1, learning_rate=1e-2, dump_rollouts=str(tmp_path), **SMALL)
    records, calls = dumped(GRPOTrainer, config)
    assert len(records) == 3 * 6 and [r["policy_version"] for r in records[::6]] == [0, 0, 1]
    for step, rollout, tensors in calls:
        rows = [r for r in records if r["step"] == step]
        assert [r["group"] for r in rows] == [0, 0, 0, 1, 1, 1]
        for row, record in enumerate(rows):
            length = int(rollout.response_mask[row].sum())
            assert record["response_ids"] == rollout.response_ids[row, :length].tolist()
            assert record["prompt_ids"] == rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
            assert record["rollout_logprobs"] == rollout.rollout_logprobs[row, :length].tolist()
            assert record["trainer_logprobs"] == tensors["trainer_logprobs"][row, :length].tolist()
            assert record["loss_mask"] == tensors["loss_mask"][row, :length].int().tolist()
            assert record["reward"] == float(tensors["rewards"][row])
            assert record["finish"] == ("stop" if rollout.finished[row] else "length") and record["temperature"] == 1.0
    gaps = [abs(a - b) for r in records if r["step"] == 2 for a, b in zip(r["rollout_logprobs"], r["trainer_logprobs"], strict=True)]
    assert max(gaps) > 1e-3  # step 2 sampled with step 1's weights: π_old (the current ones) differs


@pytest.mark.slow
def test_one_optimiser_step_dumps_its_own_forward_as_pi_old(tmp_path):
    records, _ = dumped(GRPOTrainer, GRPOConfig(steps=1, num_generations=2, dump_rollouts=str(tmp_path), **SMALL))
    gaps = [abs(a - b) for r in records for a, b in zip(r["rollout_logprobs"], r["trainer_logprobs"], strict=True)]
    assert len(records) == 4 and max(gaps) < 1e-4  # the fp32 sampler is the policy: ρ = 1 up to float noise
    assert all(r["policy_version"] == 0 for r in records)


@pytest.mark.slow
def test_ppo_dumps_one_group_per_response(tmp_path):
    records, calls = dumped(PPOTrainer, PPOConfig(steps=1, dump_rollouts=str(tmp_path), **SMALL))
    assert [r["group"] for r in records] == [0, 1]
    (_, rollout, tensors), = calls
    assert torch.equal(tensors["trainer_logprobs"], tensors["trainer_logprobs"].float())
    assert records[0]["trainer_logprobs"] == tensors["trainer_logprobs"][0, : int(rollout.response_mask[0].sum())].tolist()


@pytest.mark.slow
def test_a_folder_that_cannot_be_written_is_a_config_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="a file is there, not a folder"):
        dumped(GRPOTrainer, GRPOConfig(steps=1, num_generations=2, dump_rollouts=str(blocker), **SMALL))
    with pytest.raises(ConfigError, match="dump_format"):
        GRPOConfig(dump_format="csv")


@pytest.mark.slow
def test_a_resumed_run_rewrites_the_steps_after_its_checkpoint(tmp_path):
    dump = tmp_path / "dump"
    options = dict(num_generations=2, dump_rollouts=str(dump), output_dir=str(tmp_path / "run"), **SMALL)
    dumped(GRPOTrainer, GRPOConfig(steps=2, **options))
    first = list(read_dump(dump))
    (dump / "rollouts-000002.jsonl").write_text("{\"step\": 2\n")  # a killed run's step after the checkpoint, cut short
    (dump / ".rollouts-000003.jsonl.tmp").write_text("")
    records, _ = dumped(GRPOTrainer, GRPOConfig(steps=3, **options))  # resumes at step 2
    assert sorted(p.name for p in dump.iterdir()) == [f"rollouts-00000{i}.jsonl" for i in range(3)]
    assert records[: len(first)] == first and {r["step"] for r in records[len(first):]} == {2}
