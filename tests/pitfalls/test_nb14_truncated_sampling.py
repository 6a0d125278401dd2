"""Notebook 14's pitfall module: the figure, the explorer and the metrics the notebook writes."""

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.experiments.checkpoints import load  # noqa: E402
from workbench.modeling.rollout import sample  # noqa: E402
from workbench.pitfalls import nb14_truncated_sampling as ts  # noqa: E402
from workbench.tasks import (
    encode_prompts,  # noqa: E402
    rl_problems,  # noqa: E402
)

PROMPTS = [p.prompt for p in rl_problems(8)]


@pytest.fixture(scope="module")
def rows_and_model():
    model, tokenizer = load("tiny-arith-qwen2")
    return ts.sweep(model, tokenizer, PROMPTS, ts.settings_for([0.8], [2])), model, tokenizer


def test_settings_cover_no_filter_then_each_filter_alone():
    assert ts.settings_for([0.5, 0.8], [4]) == [(0, 1.0), (0, 0.5), (0, 0.8), (4, 1.0)]


def test_filter_ratio_explorer_redraws_on_a_control_change(rows_and_model):
    _, model, tokenizer = rows_and_model
    explorer = ts.filter_ratio_explorer(model, tokenizer, PROMPTS)
    explorer.controls["top_p"].value = 0.5
    assert explorer.renders == 2 and explorer.last["kept_mass"] < 1.0


def test_figure_and_metrics(rows_and_model, tmp_path):
    rows = rows_and_model[0]
    fig = ts.figure_ratio_vs_kept_mass(rows)
    assert len(fig.axes) == 2 and len(fig.axes[1].patches) == 2 * len(rows)  # bug and fix bars per setting
    plt.close(fig)
    head = ts.headline_row(rows)
    assert (head["top_k"], head["top_p"]) == (0, 0.8)
    written = written_metrics(ts.metrics(rows, head), tmp_path)
    assert written["reproduced"] == ts.verdict(head)[0]
    assert written["fixed"] == all(ts.verdict(r)[1] for r in rows)
    assert [(s["top_k"], s["top_p"]) for s in written["metrics"]["settings"]] == [(r["top_k"], r["top_p"]) for r in rows]
    assert written["headline"]["bug"] == pytest.approx(head["bug"]["mean_ratio"])
    assert ts.headline_sentence(head).startswith("Headline (top_k=0, top_p=0.8)")
    assert len(ts.sweep_lines(rows).splitlines()) == len(rows)
    assert ts.caption_note(rows).startswith(f"Left: one point per sampler setting ({len(rows)})")


CATALOGUE_PROMPTS = [p.prompt for p in rl_problems(32)]  # the catalogue's checks ran on 32 prompts


def test_p14_filters_on_a_four_token_distribution():
    from workbench.core.sampling_filters import kept_mass, kept_set, processed_logprobs

    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert kept_set(logits, top_p=0.7).tolist() == [True, True, False, False]  # mass before token 2 is 0.8 ≥ 0.7
    assert kept_set(logits, top_k=3).tolist() == [True, True, True, False]
    # top-k first, then top-p on the renormalised top-3: [0.526, 0.316, 0.158] → mass before token 2 is 0.842 ≥ 0.7
    assert kept_set(logits, top_k=3, top_p=0.7).tolist() == [True, True, False, False]
    assert kept_set(logits, top_p=0.01).tolist() == [True, False, False, False]  # the top token is always kept
    assert float(kept_mass(logits, top_p=0.7)) == pytest.approx(0.8, abs=1e-6)
    assert float(kept_mass(logits, top_k=3)) == pytest.approx(0.95, abs=1e-6)
    logp = processed_logprobs(logits.expand(4, 4), torch.arange(4), top_p=0.7)
    assert logp[:2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert torch.isinf(logp[2:]).all()
    assert processed_logprobs(logits, torch.tensor(0)).item() == pytest.approx(math.log(0.5), abs=1e-6)  # filters off


def test_p14_bad_filters_are_clear_errors(qwen):
    from workbench.core.sampling_filters import kept_set

    with pytest.raises(ValueError, match="top_p must be in"):
        kept_set(torch.zeros(4), top_p=0.0)
    with pytest.raises(ValueError, match="top_k must be an integer"):
        kept_set(torch.zeros(4), top_k=-1)
    model, tokenizer = qwen
    ids, mask = encode_prompts(tokenizer, CATALOGUE_PROMPTS[:2])
    with pytest.raises(ValueError, match="engine='workbench'"):
        sample(model, ids, mask, max_new_tokens=2, eos_token_id=2, pad_token_id=0, top_p=0.8, engine="hf")


def test_p14_sampler_draws_only_kept_tokens_and_records_processed_logprobs(qwen):
    from workbench.core.sampling_filters import kept_set, processed_logprobs
    from workbench.pitfalls.nb14_truncated_sampling import response_logits, rollout_with_filters

    model, tokenizer = qwen
    rollout = rollout_with_filters(model, tokenizer, CATALOGUE_PROMPTS, top_k=2, top_p=0.9, temperature=1.3)
    logits, real = response_logits(model, rollout, 1.3), rollout.response_mask.bool()
    kept = kept_set(logits, top_k=2, top_p=0.9).gather(-1, rollout.response_ids[..., None]).squeeze(-1)
    assert kept[real].all()
    torch.testing.assert_close(processed_logprobs(logits, rollout.response_ids, top_k=2, top_p=0.9)[real],
                               rollout.rollout_logprobs[real], atol=1e-5, rtol=0)
    ids, mask = encode_prompts(tokenizer, CATALOGUE_PROMPTS[:8])
    greedy = sample(model, ids, mask, max_new_tokens=4, eos_token_id=2, pad_token_id=0, greedy=True)
    top1 = sample(model, ids, mask, max_new_tokens=4, eos_token_id=2, pad_token_id=0, top_k=1,
                  generator=torch.Generator().manual_seed(3))
    assert torch.equal(greedy.response_ids, top1.response_ids)


def test_p14_ratio_is_the_kept_mass_and_the_fix_gives_one(qwen):
    from workbench.pitfalls import nb14_truncated_sampling as ts

    model, tokenizer = qwen
    row = ts.first_step_ratio(model, tokenizer, CATALOGUE_PROMPTS, top_p=0.8)
    assert row["bug"]["mean_ratio"] < 0.99 and row["bug"]["mean_ratio"] == pytest.approx(row["kept_mass"], abs=1e-5)
    assert row["max_ratio_minus_mass"] < 1e-5 and row["bug"]["max_ratio_deviation"] <= 0.2 + 1e-5  # S ≥ top_p
    assert row["fix"]["max_ratio_deviation"] < 1e-4
    assert ts.verdict(row) == (True, True)
    top_k = ts.first_step_ratio(model, tokenizer, CATALOGUE_PROMPTS, top_k=1)
    assert top_k["bug"]["clip_fraction"] > 0.1 and top_k["fix"]["clip_fraction"] == 0.0
    off = ts.first_step_ratio(model, tokenizer, CATALOGUE_PROMPTS)  # no filters: no bug to reproduce
    assert ts.verdict(off)[0] is False and off["bug"]["max_ratio_deviation"] < 1e-4


def test_p14_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb14_truncated_sampling import verdict

    clean = {"kept_mass": 0.9, "bug": {"mean_ratio": 1.0}, "fix": {"max_ratio_deviation": 0.0}}
    assert verdict(clean) == (False, True)
    broken_fix = {"kept_mass": 0.9, "bug": {"mean_ratio": 0.9}, "fix": {"max_ratio_deviation": 0.05}}
    assert verdict(broken_fix) == (True, False)
