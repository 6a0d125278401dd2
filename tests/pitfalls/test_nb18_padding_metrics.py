"""nb18_padding_metrics: the catalogue's by-hand and tiny-model checks and the verdict."""

import pytest
import torch

from workbench.experiments.checkpoints import load
from workbench.tasks import rl_problems

PROMPTS = [p.prompt for p in rl_problems(32)]


def test_p18_logged_metrics_by_hand():
    from workbench.pitfalls.nb18_padding_metrics import logged_metrics

    logp = torch.tensor([[-1.0, -2.0, -30.0], [-0.5, -30.0, -30.0]])  # −30: the log-prob of a pad token
    ref = torch.tensor([[-1.5, -2.0, -29.0], [-0.5, -28.0, -28.0]])
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])  # stored as 0 where masked
    entropy = torch.tensor([[0.4, 0.2, 3.0], [0.6, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m = logged_metrics(logp, ref, old, entropy, mask)
    assert m["masked"]["entropy"] == pytest.approx(0.4) and m["masked"]["kl"] == pytest.approx(0.5 / 3)
    assert m["masked"]["ratio"] == pytest.approx(1.0) and m["masked"]["sequence_entropy"] == pytest.approx(1.75)
    assert m["sentinel"]["sequence_entropy"] == pytest.approx(0.25)  # rows: 1 + 2 − 1 and 0.5 − 1 − 1
    assert m["unmasked"]["entropy"] == pytest.approx(10.2 / 6) and m["unmasked"]["kl"] == pytest.approx((0.5 - 1 - 2 - 2) / 6)


def test_p18_unmasked_and_sentinel_statistics_move_with_the_pad_count(qwen):
    from workbench.pitfalls import nb18_padding_metrics as pm

    policy, tokenizer = qwen
    reference, _ = load("tiny-arith-gpt2")
    rows = pm.pad_invariance(policy, reference, tokenizer, PROMPTS[:16], [0, 8])
    assert rows[0]["sentinel"]["sequence_entropy"] - rows[1]["sentinel"]["sequence_entropy"] == pytest.approx(8.0, abs=1e-4)
    assert pm.drift(rows, "unmasked", "ratio") > 0.1 and pm.drift(rows, "unmasked", "kl") > 0.1
    assert all(pm.drift(rows, "masked", k) < 1e-5 for k in ("entropy", "kl", "ratio", "sequence_entropy"))
    assert pm.verdict(rows) == (True, True)


def test_p18_verdict_says_false_on_bug_absent_numbers():
    from workbench.pitfalls.nb18_padding_metrics import verdict

    values = {"entropy": 0.6, "kl": 0.5, "ratio": 1.0, "sequence_entropy": 2.0}
    same = [{"extra_pads": w, **{mode: dict(values) for mode in ("unmasked", "sentinel", "masked")}} for w in (0, 8)]
    assert verdict(same) == (False, True)
    moved = [same[0], {**same[1], "masked": {**values, "kl": 0.6}}]
    assert verdict(moved) == (False, False)
