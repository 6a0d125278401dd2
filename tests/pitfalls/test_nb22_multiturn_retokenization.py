"""nb22_multiturn_retokenization: the catalogue's checks and the verdict."""

from workbench.experiments.checkpoints import load
from workbench.modeling import models
from workbench.trainers import realistic_chat


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
