"""nb42_turn_separator_dropped: the separator each template writes, the stitching both ways, the verdict on numbers,
metrics(), the figure, the printed lines and the explorer; the whole measurement on the chat checkpoint (slow)."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.modeling import models, realistic
from workbench.pitfalls import nb42_turn_separator_dropped as p42


@pytest.fixture(scope="module")
def chatml():
    return models.load_tokenizer(realistic.checkpoint("qwen2"))


def fake_stats(scale: float = 1.0) -> dict:
    """What ``separator_shift`` returns for three episodes of two next-turn tokens (the third one token long)."""
    lengths = torch.tensor([2, 2, 1])
    shift_bug = scale * torch.tensor([[0.5, -0.1], [0.2, 0.0], [-0.5, 0.0]])
    shift_fix = torch.zeros(3, 2)
    stats = {"episodes": 3, "turn2_tokens": 5, "lengths": lengths, "lost_ids": [201], "lost_tokens": ["Ċ"],
             "lost_per_episode": 1.0}
    for variant, shift, equal in (("bug", shift_bug, 0.0), ("fix", shift_fix, 1.0)):
        stats.update({f"shift_{variant}": shift, f"sequence_shift_{variant}": shift.sum(-1),
                      f"equals_template_{variant}": equal,
                      f"mean_abs_token_shift_{variant}": float(shift.abs().sum() / 5),
                      f"max_abs_sequence_shift_{variant}": float(shift.sum(-1).abs().max()),
                      f"mean_abs_sequence_shift_{variant}": float(shift.sum(-1).abs().mean())})
    return stats


def test_chatml_separator_is_the_newline_and_the_bug_stitching_loses_it(chatml):
    turn_end = chatml.convert_tokens_to_ids("<|im_end|>")
    separator = p42.turn_separator_ids(chatml, turn_end)
    assert chatml.convert_ids_to_tokens(separator) == ["Ċ"]
    tool = p42.tool_turn_ids(chatml, "55")
    assert chatml.convert_ids_to_tokens(tool)[0] == "<|im_start|>"  # rendered alone: no leading separator
    prompt, sampled = [5, 6], [7, 8]
    reference = prompt + sampled + [turn_end] + p42.template_tail_ids(chatml, turn_end, "55")
    bug = p42.stitch(prompt, sampled, turn_end, separator, tool, drop_separator=True)
    fix = p42.stitch(prompt, sampled, turn_end, separator, tool, drop_separator=False)
    assert fix == reference and len(bug) == len(reference) - 1
    assert p42.lost_tokens(reference, bug) == separator and p42.lost_tokens(reference, fix) == []


def test_llama3_template_has_no_separator_to_drop():
    llama = models.load_tokenizer(realistic.checkpoint("llama"))
    turn_end = llama.convert_tokens_to_ids("<|eot_id|>")
    assert p42.turn_separator_ids(llama, turn_end) == []
    tool = p42.tool_turn_ids(llama, "55")
    assert llama.convert_ids_to_tokens(tool)[0] == "<|start_header_id|>"  # the template's BOS is not stitched in
    reference = [1, turn_end] + p42.template_tail_ids(llama, turn_end, "55")
    assert p42.stitch([1], [], turn_end, [], tool, drop_separator=True) == reference


def test_verdict_on_bug_present_and_absent_numbers():
    stats = fake_stats()
    assert p42.verdict(stats) == (True, True)
    clean = {**stats, "lost_ids": [], "lost_tokens": [], "mean_abs_sequence_shift_bug": 0.0}
    assert p42.verdict(clean) == (False, True) and "no separator to drop" in p42.not_shown(clean)
    tiny = fake_stats(scale=0.01)  # a token is lost but the model hardly notices: |Σ Δ| = (0.004 + 0.002 + 0.005) / 3
    assert p42.verdict(tiny)[0] is False and "moves by only 0.0037 nats" in p42.not_shown(tiny)
    unfixed = {**stats, "equals_template_fix": 0.5}
    assert p42.verdict(unfixed) == (True, False)
    assert p42.verdict({**stats, "max_abs_sequence_shift_fix": 1e-3}) == (True, False)


def test_metrics_figure_lines_and_explorer():
    stats = fake_stats()
    kwargs = p42.metrics(stats)
    check_metrics(kwargs, "42_turn_separator_dropped")
    assert (kwargs["reproduced"], kwargs["fixed"], kwargs["not_shown"]) == (True, True, None)
    assert not any(isinstance(v, torch.Tensor) for v in kwargs["metrics"].values())
    assert kwargs["headline"]["bug"] == pytest.approx((0.4 + 0.2 + 0.5) / 3) and kwargs["headline"]["fix"] == 0.0
    assert drew(p42.figure_separator_shift(stats))
    lines = p42.stats_lines(stats).splitlines()
    assert lines[0].startswith("token lost at each assistant → tool boundary: ['Ċ'] (ids [201])")
    assert "0% (bug), 100% (fix)" in lines[1] and "3 episodes, 5 tokens" in lines[2]
    episodes = [{"question": "1+1=", "turn2": [5], "boundary": 2, "reference": [1, 2, 3, 4], "bug": [1, 2, 4], "fix": [1, 2, 3, 4]}] * 3
    explorer = p42.episode_explorer(episodes, stats, models.load_tokenizer(realistic.checkpoint("qwen2")))
    assert explorer.renders == 1 and explorer.last["sequence_shift_bug"] == pytest.approx(0.4)
    explorer.controls["episode"].value = 2
    assert explorer.renders == 2 and explorer.last == {"episode": 2, "sequence_shift_bug": -0.5, "sequence_shift_fix": 0.0}


@pytest.mark.slow
def test_p42_dropped_separator_moves_the_next_turn_and_the_fix_equals_the_rendering():
    from workbench.experiments.checkpoints import load
    from workbench.modeling.stop_ids import template_turn_end
    from workbench.trainers import realistic_chat

    model, tokenizer = load(realistic_chat.resolve("realistic-qwen2-chat"))
    episodes = p42.tool_episodes(model, tokenizer, 16, turn_end_id=template_turn_end(tokenizer))
    stats = p42.separator_shift(model, tokenizer, episodes)
    assert stats["episodes"] >= 8 and stats["lost_tokens"] == ["Ċ"] and stats["lost_per_episode"] == 1.0
    assert stats["equals_template_bug"] == 0.0 and stats["equals_template_fix"] == 1.0
    assert stats["mean_abs_sequence_shift_bug"] > 0.05 and stats["max_abs_sequence_shift_fix"] == 0.0
    assert p42.verdict(stats) == (True, True)
