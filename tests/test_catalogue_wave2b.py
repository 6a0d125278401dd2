"""P17, P19, P21, P22, P23: each pitfall's signature with the switch on, its absence with the fix,
hand-computed values where maths is involved, and verdicts that say False on bug-absent numbers."""

import copy

import pytest
import torch

from workbench.experiments import checkpoints
from workbench.experiments.checkpoints import load
from workbench.modeling import models
from workbench.pitfalls import nb23_bf16_updates as bf16_updates
from workbench.trainers import realistic_chat


@pytest.fixture(scope="module")
def qwen():
    return load("tiny-arith-qwen2")


# ---- P23 pure-bf16 updates ---------------------------------------------------------------------
def test_p23_bf16_spacing_by_hand():
    assert float(bf16_updates.bf16_ulp(1.0)) == 2**-7
    assert float(bf16_updates.bf16_ulp(1.5)) == 2**-7 and float(bf16_updates.bf16_ulp(2.0)) == 2**-6
    assert float(bf16_updates.bf16_ulp(0.02)) == 2**-13  # 0.02 lies in [2^-6, 2^-5)
    assert not bf16_updates.update_survives(1.0, 1e-4)  # 1e-4 < 2^-8: rounded away in bf16
    assert bf16_updates.update_survives(1.0, 1e-4, torch.float32)  # kept in fp32
    assert not bf16_updates.update_survives(1.0, 2**-8)  # exactly half an ulp: ties to even (1.0)
    assert bf16_updates.update_survives(1.0, 2**-8 + 2**-12)
    # prediction: |w| = 1 freezes, |w| = 1e-3 (ulp 2^-17 ≈ 7.6e-6) moves with a step of 1e-4
    assert bf16_updates.predicted_lost_fraction(torch.tensor([1.0, -1.0, 1e-3, 2e-3]), 1e-4) == 0.5


def test_p23_pure_bf16_freezes_weights_and_fp32_masters_do_not(qwen):
    model, tokenizer = qwen
    batch = bf16_updates.sft_batch_for(tokenizer, n=16)
    bug = bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="bf16", lr=1e-5, steps=2)
    fix = bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="bf16-mixed", lr=1e-5, steps=2)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert bug["frozen_fraction"] > 0.8 and fix["frozen_fraction"] < 1e-3
    assert bug["frozen_fraction_by_kind"]["gains and biases"] > 0.9  # norm gains ≈ 1 never move
    assert abs(bug["frozen_fraction"] - bf16_updates.predicted_lost_fraction(weights, 1e-5)) < 0.05
    assert bf16_updates.verdict(bug["frozen_fraction"], fix["frozen_fraction"]) == (True, True)


def test_p23_verdict_false_on_bug_absent_numbers():
    assert bf16_updates.verdict(0.0, 0.0) == (False, True)  # nothing frozen: no bug to see
    assert bf16_updates.verdict(0.9, 0.4) == (True, False)  # masters that still freeze: not fixed


def test_p23_bad_precision_is_a_clear_error(qwen):
    model, tokenizer = qwen
    with pytest.raises(ValueError, match="bf16-mixed"):
        batch = bf16_updates.sft_batch_for(tokenizer, n=4)
        bf16_updates.adam_steps(copy.deepcopy(model), batch, precision="fp8", lr=1e-5, steps=1)


# ---- P19 batch-shape-dependent log-probs ------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_chat_bf16():
    from workbench.pitfalls import nb19_batch_shape_logprobs as batch_shape
    from workbench.tasks import rl_problems

    model, tokenizer = load(realistic_chat.resolve("realistic-qwen2-chat"), dtype=torch.bfloat16)
    prompts = [p.prompt if i % 2 else "Say something." for i, p in enumerate(rl_problems(24))]
    # two long-context prompts pad the whole batch past the CPU attention key block (512 keys): a split every ISA has
    prompts = batch_shape.mixed_prompts(prompts, tokenizer, long_prompts=2)
    return model, tokenizer, batch_shape.sample_episodes(model, tokenizer, prompts, max_new_tokens=16)


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


def test_p19_long_context_prompts_by_hand(qwen_chat_bf16):
    from workbench.pitfalls import nb19_batch_shape_logprobs as p19

    model, tokenizer, episodes = qwen_chat_bf16
    mixed = p19.mixed_prompts(["a?", "b?", "c?", "d?"], tokenizer, long_prompts=2)
    assert [len(p) > 100 for p in mixed] == [True, False, True, False] and mixed[0].endswith("Question: a?")
    assert sorted(len(e[0]) for e in episodes)[-2] > p19.KV_BLOCK  # the fixture's batch is padded past the key block
    assert p19.position_limit(model) is None  # rotary: no position table
    with pytest.raises(ValueError, match="long_prompts=5"):
        p19.mixed_prompts(["a?"] * 4, tokenizer, long_prompts=5)


def test_p19_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb19_batch_shape_logprobs as p19

    assert p19.verdict({"max_ratio_deviation": 2e-6}, {"max_ratio_deviation": 0.0}) == (False, True)
    assert p19.verdict({"max_ratio_deviation": 5e-3}, {"max_ratio_deviation": 5e-3}) == (True, False)


# ---- P21 duplicate BOS -------------------------------------------------------------------------
def test_p21_bos_counting_and_guard_by_hand():
    from workbench.pitfalls import nb21_duplicate_bos as p21

    assert p21.leading_bos([7, 7, 3, 7], 7) == 2 and p21.leading_bos([3, 7], 7) == 0 and p21.leading_bos([5], None) == 0
    assert p21.strip_duplicate_bos([7, 7, 7, 3], 7) == [7, 3] and p21.strip_duplicate_bos([7, 3], 7) == [7, 3]


def test_p21_audit_finds_the_two_bos_path_only_on_the_llama_like_tokenizer():
    from workbench.modeling import realistic
    from workbench.pitfalls import nb21_duplicate_bos as p21

    llama = p21.bos_audit(models.load_tokenizer(realistic.checkpoint("llama")))
    assert llama["tokenizer_adds_bos"] and llama["template_writes_bos"]
    assert llama["leading_bos"] == {"template ids": 1, "text + tokenizer()": 2, "text + tokenizer(add_special_tokens=False)": 1}
    qwen = p21.bos_audit(models.load_tokenizer(realistic.checkpoint("qwen2")))
    assert set(qwen["leading_bos"].values()) == {0}


def test_p21_two_bos_shift_the_log_probs_and_one_bos_does_not():
    from workbench.pitfalls import nb21_duplicate_bos as p21
    from workbench.tasks import rl_problems

    model, tokenizer = checkpoints.load("realistic-llama-chat", dtype=None, device="cpu", pad_token="keep")
    shift = p21.response_shift(model, tokenizer, [p.prompt for p in rl_problems(8)], max_new_tokens=8)
    bug, fix = shift["paths"]["text + tokenizer()"], shift["paths"]["text + tokenizer(add_special_tokens=False)"]
    assert bug["leading_bos"] == 2 and bug["mean_abs_log_ratio"] > 1e-2
    assert fix["leading_bos"] == 1 and fix["max_ratio_deviation"] == 0.0 and shift["guard_recovers_template_ids"]
    assert p21.verdict(bug, fix) == (True, True)


def test_p21_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb21_duplicate_bos as p21

    one_bos = {"leading_bos": 1, "mean_abs_log_ratio": 0.0, "max_ratio_deviation": 0.0}
    assert p21.verdict(one_bos, one_bos) == (False, True)
    two_bos_no_shift = {"leading_bos": 2, "mean_abs_log_ratio": 0.0, "max_ratio_deviation": 0.0}
    assert p21.verdict(two_bos_no_shift, two_bos_no_shift) == (False, False)


# ---- P17 stop-token identity -------------------------------------------------------------------
def test_p17_union_of_sources_by_hand():
    from workbench.modeling.stop_ids import union_stop_ids

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
    from workbench.modeling.stop_ids import stop_id_sources
    from workbench.pitfalls import nb17_stop_tokens as p17
    from workbench.tasks import rl_problems

    model, tokenizer = checkpoints.load("realistic-qwen2-base-chat", dtype=None, device="cpu", pad_token="keep")
    prompts = [p.prompt for p in rl_problems(8)]
    runs = {name: p17.rollout_under(model, tokenizer, prompts, max_new_tokens=16, **ids)
            for name, ids in p17.scenarios(stop_id_sources(model.generation_config, tokenizer)).items()}
    never, miscounted, union = runs.values()
    assert never["stopped_fraction"] == 0.0 and never["truncated_fraction"] == 1.0 and never["mean_length"] == 16
    assert miscounted["stopped_fraction"] == 1.0 and miscounted["truncated_fraction"] == 1.0
    assert union["truncated_fraction"] == 0.0 and union["mean_length"] < 8
    assert p17.verdict(never["truncated_fraction"], union["truncated_fraction"]) == (True, True)


def test_p17_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb17_stop_tokens as p17

    assert p17.verdict(0.0, 0.0) == (False, True)
    assert p17.verdict(1.0, 1.0) == (True, False)


# ---- P22 multi-turn retokenisation -------------------------------------------------------------
def test_p22_roundtrip_is_not_the_identity_for_bpe_by_hand():
    from workbench.modeling import realistic
    from workbench.pitfalls import nb22_multiturn_retokenization as p22

    tokenizer = models.load_tokenizer(realistic.checkpoint("qwen2"))
    canonical = tokenizer("river", add_special_tokens=False)["input_ids"]
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "river"]
    assert len(canonical) < len(letters) and tokenizer.decode(letters) == "river"
    assert p22.roundtrip_changes(tokenizer, letters) and not p22.roundtrip_changes(tokenizer, canonical)
    suffix = tokenizer.convert_ids_to_tokens(p22.turn_suffix_ids(tokenizer, "ok", tokenizer.convert_tokens_to_ids("<|im_end|>")))
    assert suffix[:2] == ["Ċ", "<|im_start|>"] and suffix[-1] == "Ċ" and "<|im_end|>" in suffix


def test_p22_retokenised_turns_spike_and_carried_ids_do_not():
    from workbench.pitfalls import nb22_multiturn_retokenization as p22

    model, tokenizer = load(realistic_chat.resolve("realistic-qwen2-chat"))
    turn_end = p22.template_turn_end_id(tokenizer)
    episodes = p22.two_turn_episodes(model, tokenizer, ["Say something."] * 24, "And again?", turn_end_id=turn_end)
    for e in episodes:  # the fix's next prompt carries the sampled ids verbatim
        assert e["next_prompt_fix"][: len(e["prompt"]) + len(e["sampled"])] == e["prompt"] + e["sampled"]
    stats = p22.turn_log_ratios(model, episodes, tokenizer.pad_token_id)
    assert 0 < stats["changed_fraction"] < 1 and stats["max_abs_log_ratio_bug"] > 1.0
    assert stats["max_abs_log_ratio_fix"] == 0.0
    unchanged = [e["retokenized"] == e["sampled"] for e in episodes]
    assert all(abs(float(v)) < 1e-5 for v, same in zip(stats["log_ratio_bug"], unchanged, strict=True) if same)
    assert p22.verdict(stats) == (True, True)


def test_p22_verdict_false_on_bug_absent_numbers():
    from workbench.pitfalls import nb22_multiturn_retokenization as p22

    clean = {"changed_fraction": 0.0, "max_abs_log_ratio_bug": 0.0, "max_abs_log_ratio_fix": 0.0}
    assert p22.verdict(clean) == (False, True)
    unfixed = {"changed_fraction": 0.2, "max_abs_log_ratio_bug": 5.0, "max_abs_log_ratio_fix": 5.0}
    assert p22.verdict(unfixed) == (True, False)
