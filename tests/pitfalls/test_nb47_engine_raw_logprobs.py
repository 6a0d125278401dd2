"""nb47_engine_raw_logprobs: the sampler's raw log-probs (before temperature: the bug) vs processed ones (the fix)
against the trainer at τ, the sampler's ``logprobs_mode`` switch against hand-computed log-softmaxes, the engine part
skipped with its reason, the verdict both ways, figures, explorer and metrics; vLLM itself in a slow test."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.engines import envs
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.pitfalls import nb47_engine_raw_logprobs as erl
from workbench.tasks import encode_prompts, rl_problems

PROMPTS = [p.prompt for p in rl_problems(16)]


def _batch(tokenizer):
    return encode_prompts(tokenizer, PROMPTS)


def test_sampler_logprobs_mode_is_the_untempered_log_softmax(qwen):
    model, tokenizer = qwen
    ids, mask = _batch(tokenizer)
    kw = dict(max_new_tokens=6, temperature=0.5, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with erl.one_thread_if_tiny(model), torch.no_grad():
        raw = sample(model, ids, mask, logprobs_mode="raw", generator=torch.Generator().manual_seed(3), **kw)
        processed = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
        at_1 = response_logprobs(model, ids, mask, raw.response_ids, raw.response_mask, temperature=1.0)
        at_tau = response_logprobs(model, ids, mask, raw.response_ids, raw.response_mask, temperature=0.5)
    assert torch.equal(raw.response_ids, processed.response_ids)  # the mode changes what is reported, not the draw
    keep = raw.response_mask.bool()
    assert (raw.rollout_logprobs - at_1)[keep].abs().max() < 1e-4
    assert (processed.rollout_logprobs - at_tau)[keep].abs().max() < 1e-4
    assert (raw.rollout_logprobs - processed.rollout_logprobs)[keep].abs().max() > 0.1
    with pytest.raises(ValueError, match="logprobs_mode"):
        sample(model, ids, mask, logprobs_mode="processed_logprobs", **kw)


def test_ratio_stats_by_hand():
    trainer = torch.log(torch.tensor([[0.5, 0.2], [0.9, 0.1]]))
    sampler = torch.log(torch.tensor([[0.25, 0.2], [0.3, 0.1]]))
    stats = erl.ratio_stats(trainer, sampler, torch.tensor([[1, 1], [1, 0]]), tis_cap=2.0)
    assert stats["max_ratio_deviation"] == pytest.approx(2.0)  # ρ = 3 at the third token
    assert stats["first_token_ratio"] == pytest.approx((2.0 + 3.0) / 2)
    assert stats["above_cap"] == pytest.approx(1 / 3) and stats["tis_weight"] == pytest.approx((2 + 1 + 2) / 3)


def test_bug_and_fix_on_the_tiny_model(qwen):
    model, tokenizer = qwen
    ids, mask = _batch(tokenizer)
    results = erl.sweep(model, tokenizer, ids, mask, [0.6, 1.0])
    assert results[0.6]["raw"]["max_ratio_deviation"] > 0.1 and results[0.6]["raw/τ"]["max_ratio_deviation"] > 0.1
    assert results[0.6]["processed"]["max_ratio_deviation"] < erl.MATCH and results[1.0]["raw"]["max_ratio_deviation"] < erl.MATCH
    assert erl.verdict(results) == (True, True)
    assert erl.verdict({1.0: results[1.0]}) == (False, True)  # τ = 1: raw is processed, nothing to reproduce
    broken = {0.6: {**results[0.6], "processed": results[0.6]["raw"]}}
    assert erl.verdict(broken) == (True, False)
    engine_bug = {"ran": True, "raw": {"max_ratio_deviation": 0.0}, "processed": {"max_ratio_deviation": 0.0}}
    assert erl.verdict(results, engine_bug) == (False, True)  # an engine that shows no gap does not reproduce it


def test_engine_part_skipped_with_its_reason(qwen, monkeypatch):
    model, tokenizer = qwen
    ids, mask = _batch(tokenizer)
    monkeypatch.setattr(envs, "locate", lambda: envs.EngineEnvStatus(name="vllm", ready=False, python="", reason="no env"))
    skipped = erl.engine_case(model, tokenizer, ids, mask, model_name="tiny-arith-qwen2", temperature=0.6)
    assert skipped == {"ran": False, "reason": "not run: the vLLM CPU engine is not installed (`make engines`; no env)"}
    monkeypatch.setattr(envs, "locate", lambda: envs.EngineEnvStatus(name="vllm", ready=True, python="", reason=""))
    wrong_shape = erl.engine_case(model, tokenizer, ids, mask, model_name="tiny-arith-qwen2", temperature=0.6)
    assert not wrong_shape["ran"] and "head_dim" in wrong_shape["reason"]


@pytest.mark.slow  # ~5 CPU-seconds: two figures checked for legibility and an explorer sampling twice
def test_metrics_figures_lines_and_explorer(qwen):
    from workbench.viz import legibility

    model, tokenizer = qwen
    ids, mask = _batch(tokenizer)
    results = erl.sweep(model, tokenizer, ids, mask, [0.6, 1.0, 1.5])
    engine = {"ran": False, "reason": "not run: run_engine=False"}
    kwargs = erl.metrics(results, engine, 0.6, {})
    check_metrics(kwargs, "47_engine_raw_logprobs")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] > 0.1 > kwargs["headline"]["fix"]
    ran = {"ran": True, "temperature": 0.6, "engine": {"vllm": "0.32.0", "dtype": "float32"},
           **{m: results[0.6][m] for m in ("raw", "processed")}}
    for e in (engine, ran):
        fig = erl.figure_engine_logprobs(results, e, 0.6, 2.0)
        assert drew(fig) and fig.get_size_inches()[0] <= 9.6 and legibility.check_figure(fig).problems() == []
    assert erl.engine_line(engine) == "vLLM: not run: run_engine=False" and erl.engine_line(ran).startswith("vLLM 0.32.0 (CPU, float32)")
    assert len(erl.ratio_lines(results).splitlines()) == 3 and "(vLLM not run)" in erl.headline_sentence(results, engine, 0.6)
    assert erl.headline_temperature(results, 0.7) == 1.5 or erl.headline_temperature(results, 0.7) == 0.6
    explorer = erl.logprobs_explorer(model, tokenizer, ids[:4], mask[:4])
    assert explorer.renders == 1 and explorer.last["max_abs_log_ratio"] > 0.05
    explorer.controls["mode"].value = "processed"
    assert explorer.renders == 2 and explorer.last["max_abs_log_ratio"] < erl.MATCH


@pytest.mark.slow
@pytest.mark.skipif(not envs.locate().ready, reason="the vLLM CPU engine is not installed (make engines)")
def test_vllm_raw_vs_processed_logprobs():
    from workbench.experiments.checkpoints import load

    model, tokenizer = load("tiny-arith-qwen2-hd32")
    ids, mask = encode_prompts(tokenizer, PROMPTS[:8])
    engine = erl.engine_case(model, tokenizer, ids, mask, model_name="tiny-arith-qwen2-hd32", temperature=0.6, max_new_tokens=4)
    assert engine["ran"] and engine["raw"]["max_ratio_deviation"] > erl.GAP
    assert engine["processed"]["max_ratio_deviation"] < erl.MATCH
