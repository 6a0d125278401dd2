"""nb19_batch_shape_logprobs: metrics(), the figures, the printed lines, the long-prompt guard and the layout explorer."""

import copy

import pytest
import torch
from pitfall_fakes import axes, check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb19_batch_shape_logprobs as p19
from workbench.trainers import realistic_chat

SIZES = [1, 4, 8]


def case(deviation: float) -> dict:
    log_ratio = torch.tensor([deviation, -deviation / 2, 0.0])
    return {"log_ratio": log_ratio, "tokens": 3, "max_ratio_deviation": float((log_ratio.exp() - 1).abs().max()),
            "mean_abs_log_ratio": float(log_ratio.abs().mean()), "fraction_ratio_not_one": float((log_ratio != 0).float().mean()),
            "clip_fraction": float(((log_ratio.exp() - 1).abs() > 0.2).float().mean())}


def ratios(bug: float = 0.3) -> dict:
    return {"π_old over the batch (bug)": case(bug), "π_old in the training layout": case(0.0), "fixed width for every batch": case(0.0)}


SWEEPS = {name: [{k: v for k, v in case(d).items() if k != "log_ratio"} | {"micro_batch_size": s} for s, d in zip(SIZES, ds, strict=True)]
          for name, ds in (("fp32", (1e-7, 2e-7, 0.0)), ("bf16", (1e-2, 3e-2, 2e-2)))}


DRIFT = {"fp32": [0.0, 1e-7, 2e-7], "bf16": [0.0, 1e-2, 4e-2]}


def test_metrics_returns_write_metrics_arguments():
    kwargs = p19.metrics(drift=DRIFT, sweeps=SWEEPS, ratios=ratios(), train_micro_batch=8, not_shown=["no long prompts"])
    check_metrics(kwargs, "19_batch_shape_logprobs")
    assert (kwargs["reproduced"], kwargs["fixed"]) == (True, True) and kwargs["not_shown"] == ["no long prompts"]
    assert kwargs["metrics"]["width_drift_max"] == {"fp32": 2e-7, "bf16": 4e-2}
    assert all("log_ratio" not in r for r in kwargs["metrics"]["ratio_at_lr0"].values())  # tensors stay out of metrics.json
    assert kwargs["headline"]["bug"] == pytest.approx(0.3499, abs=1e-3) and kwargs["headline"]["fix"] == 0.0
    assert "micro-batch 8" in kwargs["headline"]["what"]


def test_metrics_say_why_when_the_layout_does_not_move_the_log_probs():
    kwargs = p19.metrics(drift=DRIFT, sweeps=SWEEPS, ratios=ratios(bug=0.0), train_micro_batch=8, not_shown=[])
    assert not kwargs["reproduced"] and len(kwargs["not_shown"]) == 1 and "barely move" in kwargs["not_shown"][0]


def test_figures_and_lines():
    assert drew(p19.figure_width_drift([10, 11, 12], DRIFT))
    assert drew(p19.figure_micro_batch_sweep(SIZES, SWEEPS))
    fig, ax = axes()
    p19.plot_log_ratio(ax, "π_old over the batch (bug)", case(0.3))
    assert drew(fig)
    assert p19.width_drift_line(DRIFT) == "max drift over widths: bf16 4.00e-02, fp32 2.00e-07 nats"
    assert p19.sweep_note(SWEEPS, SIZES, 8).startswith("micro-batch 8: ")
    assert p19.sweep_note(SWEEPS, SIZES, 3).startswith("micro-batch 8: ")  # not swept: the largest size
    assert len(p19.ratio_lines(ratios()).splitlines()) == 4  # three cases and the clip note


def test_long_prompts_only_where_the_position_table_reaches_past_the_key_block():
    from workbench.experiments.checkpoints import load

    gpt2, _ = load("tiny-arith-gpt2")  # learned positions, 256 of them
    long_prompts, not_shown = p19.usable_long_prompts(gpt2, 2)
    assert long_prompts == 0 and "position table ends at 256 tokens" in not_shown[0]
    assert p19.usable_long_prompts(gpt2, 0) == (0, [])
    qwen2, _ = load("tiny-arith-qwen2")  # rotary: no table to run off
    assert p19.usable_long_prompts(qwen2, 2) == (2, [])


def test_layout_log_ratio_explorer_switches_the_case():
    explorer = p19.layout_log_ratio_explorer(ratios())
    assert explorer.renders == 1 and explorer.last["max_ratio_deviation"] > 0.3
    explorer.controls["case"].value = "fixed width for every batch"
    assert explorer.renders == 2 and explorer.last["max_ratio_deviation"] == 0.0 and "log_ratio" not in explorer.last


@pytest.fixture(scope="module")
def qwen_chat_bf16():
    from workbench.pitfalls import nb19_batch_shape_logprobs as batch_shape
    from workbench.tasks import rl_problems

    model, tokenizer = load(realistic_chat.resolve("realistic-qwen2-chat"), dtype=torch.bfloat16)
    prompts = [p.prompt if i % 2 else "Say something." for i, p in enumerate(rl_problems(24))]
    # two long-context prompts pad the whole batch past the CPU attention key block (512 keys): a split every ISA has
    prompts = batch_shape.mixed_prompts(prompts, tokenizer, long_prompts=2)
    return model, tokenizer, batch_shape.sample_episodes(model, tokenizer, prompts, max_new_tokens=16)


def _entry(fraction, deviation, clip=0.0, size=8):
    return {"fraction_ratio_not_one": fraction, "max_ratio_deviation": deviation, "clip_fraction": clip, "micro_batch_size": size}


@pytest.mark.numeric  # held to AVX2 in .ci/run
def test_p19_bf16_ratio_moves_at_lr0_with_another_layout_and_not_with_the_fix(qwen_chat_bf16):
    from workbench.pitfalls import nb19_batch_shape_logprobs as p19

    model, tokenizer, episodes = qwen_chat_bf16
    pad = tokenizer.pad_token_id
    whole, micro = p19.layout(len(episodes)), p19.layout(8, shuffle_seed=0)
    bug = p19.ratio_at_lr0(model, episodes, old_layout=whole, train_layout=micro, pad_token_id=pad)
    recomputed = p19.ratio_at_lr0(model, episodes, old_layout=micro, train_layout=micro, pad_token_id=pad)
    width = max(len(e[0]) for e in episodes)
    fixed_width = p19.ratio_at_lr0(model, episodes, old_layout=p19.layout(len(episodes), width=width),
                                   train_layout=p19.layout(8, shuffle_seed=0, width=width), pad_token_id=pad)
    assert bug["max_ratio_deviation"] > 1e-3 and bug["fraction_ratio_not_one"] > 0.01
    # exact: π_old and π_θ then run the same forwards on the same shapes in one process
    assert recomputed["max_ratio_deviation"] == 0.0 and fixed_width["max_ratio_deviation"] == 0.0
    assert p19.verdict(bug, recomputed) == (True, True)
    fp32 = p19.ratio_at_lr0(copy.deepcopy(model).float(), episodes, old_layout=whole, train_layout=micro, pad_token_id=pad)
    assert fp32["max_ratio_deviation"] < 1e-5  # the same reordering costs ~1e-6 in fp32
    assert p19.verdict(fp32, recomputed) == (False, True)


@pytest.mark.numeric  # held to AVX2 in .ci/run
def test_p19_width_drift_is_zero_at_the_own_width_and_not_elsewhere_in_bf16(qwen_chat_bf16):
    from workbench.pitfalls import nb19_batch_shape_logprobs as p19

    model, tokenizer, episodes = qwen_chat_bf16
    row = min(episodes, key=lambda e: len(e[0]))[0]
    widths = p19.drift_widths(len(row))  # its own width, a few wider, then across the 512-key block of CPU attention
    assert widths[0] == len(row) and widths[-1] > p19.KV_BLOCK
    drift = p19.width_drift(model, row, widths, tokenizer.pad_token_id)
    assert drift[0] == 0.0  # exact: its own width is the same forward as scoring it alone
    assert max(drift[i] for i, w in enumerate(widths) if w > p19.KV_BLOCK + 8) > 1e-4  # keys split over two blocks: any ISA
    assert max(p19.width_drift(copy.deepcopy(model).float(), row, widths, tokenizer.pad_token_id)) < 1e-5  # fp32: ~1e-6 noise
    with pytest.raises(ValueError, match="shorter than the longest row"):
        p19.row_logprobs(model, [row], micro_batch_size=1, pad_token_id=tokenizer.pad_token_id, width=len(row) - 1)


@pytest.mark.numeric  # held to AVX2 in .ci/run
def test_p19_long_context_prompts_by_hand(qwen_chat_bf16):
    from workbench.pitfalls import nb19_batch_shape_logprobs as p19

    model, tokenizer, episodes = qwen_chat_bf16
    mixed = p19.mixed_prompts(["a?", "b?", "c?", "d?"], tokenizer, long_prompts=2)
    assert [len(p) > 100 for p in mixed] == [True, False, True, False] and mixed[0].endswith("Question: a?")
    assert sorted(len(e[0]) for e in episodes)[-2] > p19.KV_BLOCK  # the fixture's batch is padded past the key block
    assert p19.position_limit(model) is None  # rotary: no position table
    with pytest.raises(ValueError, match="long_prompts=5"):
        p19.mixed_prompts(["a?"] * 4, tokenizer, long_prompts=5)


@pytest.mark.numeric  # held to AVX2 in .ci/run
def test_p19_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb19_batch_shape_logprobs as p19

    assert p19.verdict({"max_ratio_deviation": 2e-6}, {"max_ratio_deviation": 0.0}) == (False, True)
    assert p19.verdict({"max_ratio_deviation": 5e-3}, {"max_ratio_deviation": 5e-3}) == (True, False)


def test_precision_note_explains_only_when_fp32_counts_more():
    more = p19.precision_note(_entry(0.08, 5e-3), _entry(0.19, 1e-6))
    assert "fp32 counts more" in more and "8.0%" in more and "19.0%" in more
    assert "fp32 counts more" not in p19.precision_note(_entry(0.30, 5e-3), _entry(0.10, 1e-6))


def test_clip_note_follows_the_clip_fraction():
    assert "clips nothing" in p19.clip_note(_entry(0.1, 5e-3, clip=0.0))
    inside = p19.clip_note(_entry(0.1, 0.5, clip=0.046))
    assert "4.6%" in inside and "clips nothing" not in inside
