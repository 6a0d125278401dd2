"""nb22_multiturn_retokenization: metrics(), the figure, the printed lines and the episode explorer."""

import torch
from pitfall_fakes import axes, check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.modeling import models
from workbench.pitfalls import nb22_multiturn_retokenization as p22
from workbench.trainers import realistic_chat


def fake_episodes(tokenizer) -> tuple[list[dict], dict]:
    """Three turn-1 episodes, the second one re-encoded into other ids, and the stats ``turn_log_ratios`` returns."""
    ids = tokenizer("ab", add_special_tokens=False)["input_ids"]
    episodes = [{"prompt": [1], "sampled": ids, "text": "ab", "retokenized": ids, "next_prompt_bug": [1], "next_prompt_fix": [1]},
                {"prompt": [1], "sampled": ids, "text": "ab", "retokenized": ids[:1], "next_prompt_bug": [1], "next_prompt_fix": [2]},
                {"prompt": [1], "sampled": ids, "text": "ab", "retokenized": ids, "next_prompt_bug": [1], "next_prompt_fix": [1]}]
    bug, fix = torch.tensor([0.0, -2.5, 0.0]), torch.zeros(3)
    stats = {"episodes": 3, "changed_fraction": 1 / 3, "next_prompt_differs_fraction": 1 / 3, "length_change": [0, -1, 0],
             "log_ratio_bug": bug, "log_ratio_fix": fix, "max_abs_log_ratio_bug": 2.5, "max_abs_log_ratio_fix": 0.0,
             "mean_abs_log_ratio_bug": 2.5 / 3, "mean_abs_log_ratio_fix": 0.0, "examples": [("ab", ids, ids[:1])]}
    return episodes, stats


def test_metrics_returns_write_metrics_arguments(tokenizer):
    _, stats = fake_episodes(tokenizer)
    kwargs = p22.metrics(stats, n_episodes=4, max_new_tokens=8)
    check_metrics(kwargs, "22_multiturn_retokenization")
    assert (kwargs["reproduced"], kwargs["fixed"], kwargs["not_shown"]) == (True, True, None)
    assert not {"log_ratio_bug", "log_ratio_fix", "examples"} & set(kwargs["metrics"])  # tensors and token lists stay out
    assert kwargs["headline"]["bug"] == 2.5 and kwargs["headline"]["fix"] == 0.0


def test_metrics_say_why_when_no_turn_changed(tokenizer):
    _, stats = fake_episodes(tokenizer)
    stats.update(changed_fraction=0.0, max_abs_log_ratio_bug=0.0)
    kwargs = p22.metrics(stats, n_episodes=4, max_new_tokens=8)
    assert not kwargs["reproduced"] and "3 of 4 episodes" in kwargs["not_shown"]


def test_figure_and_lines(tokenizer):
    episodes, stats = fake_episodes(tokenizer)
    assert drew(p22.figure_turn_log_ratio(stats))
    fig, ax = axes()
    p22.plot_turn_log_ratio(ax, stats, highlight=1)
    outlined = [bar.get_linewidth() > 1 for bar in ax.patches]
    assert outlined == [False, True, False]  # the selected episode's bar only
    assert drew(fig)
    lines = p22.stats_lines(stats, tokenizer).splitlines()
    assert len(lines) == 3 and lines[0].startswith("3 finished episodes; turn-1 tokens changed by the round trip in 33%")
    assert "changed: " in p22.roundtrip_line(p22.letter_roundtrip(tokenizer, "ab"))


def test_episode_explorer_starts_on_a_changed_turn_and_follows_the_slider(tokenizer):
    episodes, stats = fake_episodes(tokenizer)
    explorer = p22.episode_explorer(episodes, stats, tokenizer)
    assert explorer.renders == 1 and explorer.last == {"episode": 1, "changed": True, "log_ratio_bug": -2.5, "log_ratio_fix": 0.0}
    explorer.controls["episode"].value = 2
    assert explorer.renders == 2 and explorer.last["episode"] == 2 and not explorer.last["changed"]


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
