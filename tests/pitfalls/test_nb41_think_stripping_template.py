"""nb41_think_stripping_template: the Qwen3-style template both ways, the contexts and prefix checks of a hand-made
episode, the verdict on numbers, metrics(), the figure, the printed lines and the explorer; the whole measurement
on the chat checkpoint (slow)."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.modeling import models, realistic
from workbench.pitfalls import nb41_think_stripping_template as p41


@pytest.fixture(scope="module")
def chatml():
    return models.load_tokenizer(realistic.checkpoint("qwen2"))


def hand_episode(tokenizer) -> dict:
    """A two-turn episode built from text the way ``thinking_episodes`` builds it from sampled ids."""
    enc = lambda text: p41.encode(tokenizer, text)  # noqa: E731
    header = enc("<|im_start|>assistant\n")
    head1 = enc(p41.render(tokenizer, [{"role": "user", "content": "2+3="}], add_generation_prompt=False)) + header
    think1 = enc(p41.THINK_OPEN) + enc("two plus three") + enc(p41.THINK_CLOSE)
    answer1 = enc("5") + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    user2 = enc("\n" + p41.render(tokenizer, [{"role": "user", "content": p41.SECOND_QUESTION}], add_generation_prompt=False)) + header
    messages = [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "two plus three\n</think>\n\n5"},
                {"role": "user", "content": p41.SECOND_QUESTION}]
    return {"question": "2+3=", "head1": head1, "think1": think1, "answer1": answer1, "user2": user2, "messages": messages,
            "think2": enc(p41.THINK_OPEN), "answer2": answer1}


def test_template_strips_earlier_thinking_unless_kept(chatml):
    messages = hand_episode(chatml)["messages"]
    stripped = p41.render(chatml, messages, add_generation_prompt=True)
    kept = p41.render(chatml, messages, add_generation_prompt=True, keep_thinking=True)
    assert "two plus three" not in stripped and "<|im_start|>assistant\n5<|im_end|>" in stripped
    assert "<|im_start|>assistant\n<think>\ntwo plus three\n</think>\n\n5<|im_end|>" in kept
    assert stripped.endswith("<|im_start|>assistant\n<think>\n") and kept.endswith("<|im_start|>assistant\n<think>\n")
    last = p41.render(chatml, messages[:2], add_generation_prompt=False)  # after the last user message: kept
    assert "two plus three" in last


def test_contexts_and_prefix_checks_of_a_hand_made_episode(chatml):
    episode = hand_episode(chatml)
    tito, stripped = p41.tito_context(episode), p41.stripped_context(episode)
    assert len(tito) - len(stripped) == len(episode["think1"])
    assert p41.prefix_checks(chatml, episode) == {"extends_bug": False, "extends_fix": True, "splice_is_rendering": True}
    assert p41.chatml_turn_end(chatml) == chatml.convert_tokens_to_ids("<|im_end|>")
    assert p41.chatml_turn_end(models.load_tokenizer(realistic.checkpoint("llama"))) is None


def fake_stats(scale: float = 1.0) -> dict:
    stats = {"episodes": 3, "lost_tokens_per_episode": 12.0, "lost": torch.tensor([10.0, 12.0, 14.0]),
             "lost_example": ["<", "think", ">"], "turn2_tokens": 30, "extends_bug_fraction": 0.0,
             "extends_fix_fraction": 1.0, "splice_is_rendering_fraction": 1.0}
    for turn, values in ((2, [-1.0, 0.5, -2.1]), (1, [0.3, -0.2, 0.0])):
        for variant, v in (("bug", scale * torch.tensor(values)), ("fix", torch.zeros(3))):
            stats.update({f"error_turn{turn}_{variant}": v, f"mean_abs_error_turn{turn}_{variant}": float(v.abs().mean()),
                          f"max_abs_error_turn{turn}_{variant}": float(v.abs().max())})
    return stats


def test_verdict_on_bug_present_and_absent_numbers():
    stats = fake_stats()
    assert p41.verdict(stats) == (True, True)
    quiet = fake_stats(scale=0.01)  # mean |error| 0.012 nats: below the 0.05 signature
    assert p41.verdict(quiet) == (False, True) and "0.012 nats" in p41.not_shown(quiet)
    extends = {**stats, "extends_bug_fraction": 1.0}  # a template that keeps the thinking: nothing to show
    assert p41.verdict(extends)[0] is False and "100% of the episodes" in p41.not_shown(extends)
    assert p41.verdict({**stats, "extends_fix_fraction": 0.5}) == (True, False)
    assert p41.verdict({**stats, "max_abs_error_turn1_fix": 0.2}) == (True, False)


def test_metrics_figure_lines_and_explorer(chatml):
    stats = fake_stats()
    kwargs = p41.metrics(stats)
    check_metrics(kwargs, "41_think_stripping_template")
    assert (kwargs["reproduced"], kwargs["fixed"], kwargs["not_shown"]) == (True, True, None)
    assert not any(isinstance(v, torch.Tensor) for v in kwargs["metrics"].values())
    assert kwargs["headline"]["bug"] == pytest.approx(3.6 / 3) and kwargs["headline"]["fix"] == 0.0
    assert drew(p41.figure_turn_errors(stats))
    assert p41.lost_tokens_line(stats).endswith("['<', 'think', '>'] — 12.0 per episode on average")
    lines = p41.stats_lines(stats).splitlines()
    assert lines[0].startswith("re-rendered turn-2 prompt extends the sampler's ids: 0% (stripping template), 100%")
    assert "|error| mean 1.200, max 2.100 nats (bug)" in lines[1]
    episodes = [hand_episode(chatml)] * 3
    assert "two plus three" in p41.rendering_lines(chatml, episodes[0]).splitlines()[0]
    explorer = p41.episode_explorer(episodes, stats, chatml)
    assert explorer.renders == 1 and explorer.last == {"episode": 0, "turn": 2, "error_bug": -1.0, "error_fix": 0.0}
    explorer.controls["turn"].value = 1
    assert explorer.renders == 2 and explorer.last["error_bug"] == pytest.approx(0.3)


@pytest.mark.slow
def test_p41_stripped_history_moves_each_turn_and_the_sampler_ids_do_not():
    from workbench.experiments.checkpoints import load
    from workbench.trainers import realistic_chat

    model, tokenizer = load(realistic_chat.resolve("realistic-qwen2-chat"))
    episodes = p41.thinking_episodes(model, tokenizer, 12, turn_end_id=p41.chatml_turn_end(tokenizer))
    stats = p41.per_turn_errors(model, tokenizer, episodes)
    assert stats["episodes"] >= 6 and stats["lost_tokens_per_episode"] >= 8  # <think>\n … \n</think>\n\n at least
    assert stats["extends_bug_fraction"] == 0.0 and stats["extends_fix_fraction"] == 1.0
    assert stats["mean_abs_error_turn2_bug"] > 0.1 and stats["max_abs_error_turn2_fix"] == 0.0
    assert p41.verdict(stats) == (True, True)
