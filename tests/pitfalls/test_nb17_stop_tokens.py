"""Notebook 17's pitfall module: the figures, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.experiments import checkpoints  # noqa: E402
from workbench.modeling.stop_ids import stop_id_sources, union_stop_ids  # noqa: E402
from workbench.pitfalls import nb17_stop_tokens as p17  # noqa: E402

PROMPTS = ["1+2=", "Say something.", "12+3=", "Say something."]


def fake_run(truncated: float, tokens: float) -> dict:
    return {"stopped_fraction": 1 - truncated, "counted_finished_fraction": 1 - truncated, "truncated_fraction": truncated,
            "miscounted_fraction": 0.0, "mean_length": tokens, "tokens_generated_per_response": tokens, "example": "4<|im_end|>"}


RUNS = dict(zip(["stop on generation config", "stop on turn end, count tokenizer EOS", "union of all three (fix)"],
                [fake_run(1.0, 32.0), fake_run(1.0, 3.0), fake_run(0.0, 3.0)], strict=True))


@pytest.fixture(scope="module")
def base_chat():
    policy, tokenizer = checkpoints.load("realistic-qwen2-base-chat", dtype=None, device="cpu", pad_token="keep")
    return policy, tokenizer, stop_id_sources(policy.generation_config, tokenizer)


def test_stop_source_explorer_redraws_on_a_control_change(base_chat):
    policy, tokenizer, sources = base_chat
    explorer = p17.stop_source_explorer(policy, tokenizer, PROMPTS, sources, max_new_tokens=8)
    assert explorer.last["truncated_fraction"] == 1.0  # stops and counts on the generation config's EOS only: never
    explorer.controls["stop_on"].value = "union"
    assert explorer.renders == 2 and explorer.last["stopped_fraction"] > 0 and explorer.last["truncated_fraction"] == 1.0
    explorer.controls["count_on"].value = "union"
    assert explorer.renders == 3 and explorer.last["truncated_fraction"] < 1.0


def test_figures_draw_on_a_given_ax():
    fig, axes = plt.subplots(1, 2)
    p17.plot_truncated(axes[0], RUNS)
    p17.plot_decode_steps(axes[1], RUNS, 32)
    assert len(axes[0].patches) == 3 and [p.get_height() for p in axes[1].patches] == [32.0, 3.0, 3.0]
    assert axes[1].lines[0].get_ydata()[0] == 32  # the length limit
    plt.close(fig)
    fig = p17.figure_stopping(RUNS, 32)
    assert len(fig.axes) == 2 and fig.get_size_inches()[0] <= 9.6
    plt.close(fig)
    assert "length limit (32)" in p17.caption_note(8, 32)


def test_metrics_are_write_metrics_arguments(tmp_path):
    sources = {"tokenizer": [1], "generation_config": [1], "template_turn_end": [2]}
    written = written_metrics(p17.metrics(RUNS, sources), tmp_path)
    assert (written["reproduced"], written["fixed"]) == (True, True)
    assert written["headline"]["bug"] == 1.0 and written["headline"]["fix"] == 0.0
    assert "example" not in written["metrics"]["runs"]["union of all three (fix)"]
    assert written["metrics"]["sources"] == sources and "not_shown" not in written["metrics"]
    assert len(p17.run_lines(RUNS).splitlines()) == 3


def test_p17_union_of_sources_by_hand():

    sources = {"tokenizer": [0], "generation_config": [0], "template_turn_end": [2]}
    assert union_stop_ids(sources) == [0, 2]
    assert union_stop_ids(sources, ("generation_config",)) == [0]
    with pytest.raises(ValueError, match="unknown stop-id sources"):
        union_stop_ids(sources, ("vllm",))
    with pytest.raises(ValueError, match="could never stop"):
        union_stop_ids({"tokenizer": [], "generation_config": [], "template_turn_end": []})


def test_p17_audit_flags_only_the_base_style_checkpoint():
    from workbench.modeling import realistic
    from workbench.pitfalls import nb17_stop_tokens as p17

    base = p17.audit(realistic.checkpoint("qwen2-base"))
    assert base["turn_end_covered_by"] == {"tokenizer": False, "generation_config": False}
    instruct = p17.audit(realistic.checkpoint("qwen2"))
    assert instruct["turn_end_covered_by"] == {"tokenizer": True, "generation_config": True} and len(instruct["union"]) == 2
    assert p17.audit(realistic.checkpoint("gpt2"))["turn_end_covered_by"] == {"tokenizer": None, "generation_config": None}


def test_p17_partial_stop_sets_truncate_everything_and_the_union_does_not():
    from workbench.pitfalls import nb17_stop_tokens as p17
    from workbench.tasks import rl_problems

    model, tokenizer = checkpoints.load("realistic-qwen2-base-chat", dtype=None, device="cpu", pad_token="keep")
    prompts = [p.prompt for p in rl_problems(8)]
    runs = {name: p17.rollout_under(model, tokenizer, prompts, max_new_tokens=16, **ids)
            for name, ids in p17.scenarios(stop_id_sources(model.generation_config, tokenizer)).items()}
    never, miscounted, union = runs.values()
    assert never["stopped_fraction"] == 0.0 and never["truncated_fraction"] == 1.0 and never["mean_length"] == 16
    assert miscounted["stopped_fraction"] == 1.0 and miscounted["truncated_fraction"] == 1.0
    assert miscounted["miscounted_fraction"] == 1.0 and never["miscounted_fraction"] == 0.0
    assert union["truncated_fraction"] == 0.0 and union["miscounted_fraction"] == 0.0 and union["mean_length"] < 8
    assert p17.verdict(never["truncated_fraction"], union["counted_finished_fraction"], miscounted["stopped_fraction"]) == (True, True)


def test_p17_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb17_stop_tokens as p17

    assert p17.verdict(0.0, 1.0, 1.0) == (False, True)
    assert p17.verdict(1.0, 0.0, 0.0) == (True, False)  # the union counted nothing finished


def test_p17_verdict_judges_the_fix_by_the_responses_that_stop_not_by_those_that_never_do():
    """On an H200 in bf16, 7 of 8 responses stopped on the turn end and 1 emitted no stop id within 16 tokens: under the
    union the 7 are counted finished and the 1 truncated, for real. A union that counted fewer than stopped would not be the fix."""
    from workbench.pitfalls import nb17_stop_tokens as p17

    assert p17.verdict(1.0, 0.875, 0.875) == (True, True)
    assert p17.verdict(1.0, 0.75, 0.875) == (True, False)
