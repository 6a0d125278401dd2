"""nb02_right_padding_flash_attention: metrics(), figures and the padding-side explorer."""

import torch
from pitfall_fakes import check_metrics, drew

from workbench.pitfalls import nb02_right_padding_flash_attention as padding

DIVERGENCE = {"a": {"rows": 4, "right_divergent_rows": 2, "left_divergent_rows": 0, "right": [[1], [2]], "left": [[1], [1]],
                    "alone": [[1], [1]]}}
PACKED = {"a": {"packed": 0.0, "packed, cache on": 0.0}}
REPORT = padding.PaddingReport("right", True, [0], True)


def test_metrics_returns_write_metrics_arguments():
    kwargs = padding.metrics(divergence=DIVERGENCE, packed=PACKED, report=REPORT, throughput={"padded": 1.0, "packed": 2.0},
                             entries={"padded": 16, "packed": 8}, flash={"backends": {}, "skipped": {"flash_attention_2": "no GPU"}})
    check_metrics(kwargs, "02_right_padding_flash_attention")
    assert kwargs["headline"]["bug"] == 50.0 and kwargs["headline"]["fix"] == 0.0
    assert kwargs["metrics"]["packed_speedup"] == 2.0 and kwargs["metrics"]["guard_would_raise"] is True


def test_figures_draw():
    ids = torch.tensor([[1, 2, 3, 0], [1, 2, 0, 0]])
    mask = (ids != 0).long()
    assert drew(padding.figure_ppo_masks(ids, mask, 2, REPORT, eos_token_id=3))
    assert drew(padding.figure_divergence(DIVERGENCE))
    assert drew(padding.figure_packed({"a": {"packed": 1e-7, "packed, cache on": 0.0, "labels rolled on the packed row": 2.0}}))
    assert drew(padding.figure_throughput({"padded": 1.0, "packed": 2.0}, padding.attention_entries([2, 3])))
    assert "packed: 0.0e+00" in padding.packed_lines(PACKED)


def test_padding_side_explorer_counts_divergent_rows():
    from workbench.experiments.checkpoints import load

    models = {"tiny-arith-qwen2": load("tiny-arith-qwen2")}
    explorer = padding.padding_side_explorer(models, ["1+2=", "12+34=", "5*5=", "99-3="])
    assert explorer.last["divergent_rows"] > 0
    explorer.controls["side"].value = "left"
    assert explorer.last["divergent_rows"] == 0


def test_padding_verdict_ignores_the_simulated_guard():
    packed = {"m": {"packed": 1e-6}}
    assert padding.verdict({"m": {"right_divergent_rows": 0, "left_divergent_rows": 0, "rows": 8}}, packed) == (False, True)
    assert padding.verdict({"m": {"right_divergent_rows": 3, "left_divergent_rows": 1, "rows": 8}}, packed) == (True, False)
    divergent = {"m": {"right_divergent_rows": 3, "left_divergent_rows": 0, "rows": 8}}
    assert padding.verdict(divergent, {"m": {"packed": 0.2}})[1] is False


def note_for(lengths: list[int], speedup: float) -> str:
    """``throughput_note`` for a measured packed/padded ``speedup``."""
    return padding.throughput_note(lengths, {"padded": 1.0, "packed": speedup}, padding.attention_entries(lengths))


def test_throughput_note_counts_tokens_and_entries():
    note = note_for([10, 2, 2, 2], 2.5)  # padded: 40 tokens, 400 entries; packed: 16 tokens, 256 entries
    assert "2.50× the tokens" in note and "0.64× the attention" in note and "dominates" not in note
    note = note_for([40] + [2] * 30, 2.0)  # padded 1240 tokens / 100 packed; entries 49600 vs 10000 → 0.2×
    assert "12.40× the tokens" in note
    assert "dominates" in note_for([100] + [90] * 31, 1.2)  # dense packed mask has more entries
    slower = note_for([100] + [90] * 31, 0.27)  # the speed-up the H200 measured (docs/journal/2026-11-27.md, sixth lease)
    assert "packing is slower here" in slower and "dominates" not in slower
    assert "slower" not in note_for([10, 2, 2, 2], 0.8)  # fewer entries packed: no attention story to tell


def test_flash_checks_skip_with_the_reason_where_no_flash_backend_can_run(monkeypatch):
    from workbench.modeling import attention

    monkeypatch.setattr(padding, "flash_attention_status", lambda name: (False, f"{name} cannot run in this test"))
    flash = padding.flash_checks("tiny-arith-qwen2", ["1+2="], ["1+2=3"])
    assert flash["backends"] == {} and set(flash["skipped"]) == set(attention.FLASH_BACKENDS)
    assert "flash_attention_4: skipped: flash_attention_4 cannot run in this test" in padding.flash_lines(flash)


def test_a_flash_path_that_fails_is_recorded_and_the_others_still_run(monkeypatch):
    monkeypatch.setattr(padding, "flash_attention_status", lambda name: (name == "flash_attention_4", "test"))
    monkeypatch.setattr(padding, "load", lambda name, **options: load_on_cpu(name))
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: self)  # the CUDA moves run on this CPU

    def broken(*args):
        assert not torch.is_grad_enabled()  # measurements only: no autograd graph (and no training forward for a watch)
        raise ValueError("Expected IntTuple, whose leaves are integers, but got 11")

    monkeypatch.setattr(padding, "packed_vs_alone", broken)
    flash = padding.flash_checks("tiny-arith-qwen2", ["1+2=", "12+34="], ["1+2=3"])
    assert flash["errors"] == {"flash_attention_4": "packed row: ValueError: Expected IntTuple, whose leaves are integers, but got 11"}
    gaps = flash["backends"]["flash_attention_4"]
    assert gaps["vs_sdpa"] == 0.0 and gaps["rows"] == 2 and "packed" not in gaps  # the same weights, the same back-end here
    kwargs = padding.metrics(divergence=DIVERGENCE, packed=PACKED, report=REPORT, throughput={"padded": 1.0, "packed": 2.0},
                             entries={"padded": 16, "packed": 8}, flash=flash)
    assert kwargs["metrics"]["flash_vs_sdpa_max_abs_logp_diff"] == 0.0
    line = kwargs["metrics"]["flash_attention"]
    assert "vs sdpa (left-padded batch) max |Δ log p| = 0.00e+00" in line and "failed on this machine: packed row: ValueError" in line


def load_on_cpu(name):
    from workbench.experiments.checkpoints import load

    return load(name)


def test_flash_and_sdpa_are_compared_only_on_targets_predicted_from_real_tokens():
    # left padding: row 0 has two pads, row 1 none; the first real token of row 0 is "predicted" from a pad position
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert padding.comparable_targets(mask).tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
