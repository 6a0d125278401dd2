"""experiments.comparison: variants trained in processes match the serial run."""

import pytest

from workbench.experiments import comparison


@pytest.mark.slow
def test_train_variants_in_processes_matches_serial():
    kwargs = dict(steps=1, seeds=(0, 1), problems=16, prompts_per_step=4, mini_batches=1, max_new_tokens=4)
    variants = {"a": {"whiten_over": "real"}}
    serial = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, **kwargs)
    parallel = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, processes=2, **kwargs)
    assert [[h["reward"] for h in run] for run in serial["a"]] == [[h["reward"] for h in run] for run in parallel["a"]]
