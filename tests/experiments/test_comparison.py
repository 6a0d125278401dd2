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


def test_train_variants_on_the_sums_task_trains_grpo_end_to_end(monkeypatch):
    """task="sums": sums prompts, the sums reward, 48 new tokens, held-out accuracy on sums test prompts."""
    from workbench.experiments import evaluation
    from workbench.tasks import registry

    seen = {}
    original = registry.reward
    monkeypatch.setattr("workbench.tasks.encoding.reward",
                        lambda text, finished, problem: seen.setdefault(problem.task, []).append(text) or original(text, finished, problem))
    scored = []
    held_out = evaluation.held_out_accuracy
    monkeypatch.setattr(comparison, "held_out_accuracy",
                        lambda policy, tokenizer, problems: scored.append(problems) or held_out(policy, tokenizer, problems))
    runs = comparison.train_variants("grpo", "tiny-qwen2", {"a": {}}, steps=2, problems=8, held_out=4, task="sums",
                                     prompts_per_step=2, num_generations=2)
    history = runs["a"][0]
    assert len(history) == 2
    assert set(seen) == {"sums"}
    assert [len(p) for p in scored] == [4, 4] and {p.task for p in scored[0]} == {"sums"}
    assert "heldout_accuracy" in history[-1]
    assert max(h["response_length"] for h in history) > 8  # an untrained policy rambles past arithmetic's 8 tokens
    assert max(h["response_length"] for h in history) <= 48


def test_train_variants_task_errors_name_the_fix():
    from workbench.core.errors import ParameterError

    with pytest.raises(ParameterError, match="'arith', 'sums'"):
        comparison.train_variants("grpo", "tiny-qwen2", {"a": {}}, steps=1, task="sum")
    with pytest.raises(ParameterError, match="preference pairs exist for the arithmetic task only"):
        comparison.train_variants("dpo", "tiny-qwen2", {"a": {}}, steps=1, task="sums")


def test_learning_settings_take_the_tasks_length():
    assert comparison.learning_settings("grpo")["max_new_tokens"] == 6  # measured on arithmetic, unchanged
    assert comparison.learning_settings("grpo", task="sums")["max_new_tokens"] == 48
    assert comparison.learning_settings("grpo", task="sums", max_new_tokens=40)["max_new_tokens"] == 40
