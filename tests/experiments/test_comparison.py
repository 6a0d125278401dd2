"""experiments.comparison: variants trained in processes match the serial run."""

import pytest
import torch

from workbench.experiments import comparison


@pytest.mark.slow
def test_train_variants_in_processes_matches_serial():
    """Every record of every run, held-out accuracy included, equal in worker processes and in this one (what
    ``train_variants`` promises: results do not depend on ``processes``)."""
    kwargs = dict(steps=2, seeds=(0, 1), problems=16, prompts_per_step=4, mini_batches=1, max_new_tokens=4, held_out=8)
    variants = {"a": {"whiten_over": "real"}, "b": {"whiten_over": "padded"}}
    serial = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, **kwargs)
    parallel = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, processes=2, **kwargs)
    # a worker takes cores // processes threads, this process 1 for a tiny model: equal bits where both are 1 thread (2
    # cores), a reduction split over threads elsewhere; hence a tolerance on floats, equality for the rest
    assert list(serial) == list(parallel)
    for label in serial:
        for run_serial, run_parallel in zip(serial[label], parallel[label], strict=True):
            for record_serial, record_parallel in zip(run_serial, run_parallel, strict=True):
                assert record_serial.keys() == record_parallel.keys()
                for key, value in record_serial.items():
                    if key == "seconds" or key.endswith("_seconds"):  # wall-clock times (the step, its rollout), not results
                        continue
                    if isinstance(value, float):
                        assert record_parallel[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (label, key)
                    else:
                        assert record_parallel[key] == value, (label, key)
    assert "heldout_accuracy" in serial["a"][0][-1] and serial["a"][0] != serial["a"][1]  # two seeds, two runs


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


def test_runs_in_this_process_leave_the_callers_generator_as_a_worker_would():
    """Each run seeds the global generator (P7's dropout masks); the caller's state afterwards is the one it had, as when
    the runs train in worker processes — so the cells after a notebook's training draw the same numbers either way."""
    torch.manual_seed(123)
    state = torch.get_rng_state()
    comparison.train_variants("grpo", "tiny-qwen2", {"a": {}}, steps=1, problems=4, prompts_per_step=2, num_generations=2)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_untrained_checkpoint_is_scored_once_per_call_and_every_run_records_it(monkeypatch):
    """The untrained weights' greedy scores are the same for every run: ``_held_out_start`` computes them once per
    call, not once per run; each run still records start, end and gain."""
    from workbench.experiments import evaluation

    scored = []
    held_out = evaluation.held_out_accuracy
    monkeypatch.setattr(comparison, "held_out_accuracy",
                        lambda policy, tokenizer, problems: scored.append(len(problems)) or held_out(policy, tokenizer, problems))
    runs = comparison.train_variants("ppo", "tiny-arith-qwen2", {"a": {}, "b": {"whiten_over": "padded"}}, steps=1, seeds=(0, 1),
                                     held_out=16, prompts_per_step=4, max_new_tokens=4)
    assert scored == [16] * (1 + 4)  # once before, once after each of the four runs
    policy, tokenizer = comparison.load("tiny-arith-qwen2")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a run of a tiny model in this process scores it
    try:
        direct = held_out(policy, tokenizer, comparison.load_problems(comparison.task_info("arith").test_prompts)[:16])
    finally:
        torch.set_num_threads(threads)
    for histories in runs.values():
        for history in histories:
            last = history[-1]
            assert last["heldout_accuracy_start"] == direct
            assert last["heldout_gain"] == last["heldout_accuracy"] - direct


def test_dpo_runs_record_the_held_out_pairs_before_and_after_in_the_same_order():
    runs = comparison.train_variants("dpo", "tiny-arith-qwen2", {"a": {}}, steps=1, seeds=(0, 1), held_out=12, batch_size=4)
    lasts = [history[-1] for history in runs["a"]]
    assert [list(last)[-7:] for last in lasts] == [["heldout_accuracy_start", "heldout_accuracy", "heldout_gain",
                                                    "heldout_logp_chosen_start", "heldout_logp_rejected_start",
                                                    "heldout_logp_chosen", "heldout_logp_rejected"]] * 2
    assert lasts[0]["heldout_logp_chosen_start"] == lasts[1]["heldout_logp_chosen_start"]  # the same untrained weights
    assert lasts[0]["heldout_logp_chosen"] != lasts[0]["heldout_logp_chosen_start"]  # one update moved them
