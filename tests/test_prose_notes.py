"""Sentences chosen by the numbers in the notebooks' prose (review fixes): each branch is fed numbers
that must select it, and numbers that must not."""

from workbench.pitfalls import nb19_batch_shape_logprobs as p19


def _entry(fraction, deviation, clip=0.0, size=8):
    return {"fraction_ratio_not_one": fraction, "max_ratio_deviation": deviation, "clip_fraction": clip, "micro_batch_size": size}


def test_precision_note_explains_only_when_fp32_counts_more():
    more = p19.precision_note(_entry(0.08, 5e-3), _entry(0.19, 1e-6))
    assert "fp32 counts more" in more and "8.0%" in more and "19.0%" in more
    assert "fp32 counts more" not in p19.precision_note(_entry(0.30, 5e-3), _entry(0.10, 1e-6))


def test_clip_note_follows_the_clip_fraction():
    assert "clips nothing" in p19.clip_note(_entry(0.1, 5e-3, clip=0.0))
    inside = p19.clip_note(_entry(0.1, 0.5, clip=0.046))
    assert "4.6%" in inside and "clips nothing" not in inside


def test_missing_eos_note_follows_the_counts():
    import torch

    from workbench.pitfalls import nb03_eos_termination as eos

    finished = torch.tensor([True, True, False, False])
    note = eos.missing_eos_note(torch.tensor([1.0, 0.0, 0.0, 0.0]), finished, 1.0)
    assert "2/4 responses truncated" in note and "1 of them wrong" in note and "below the finished-but-wrong" in note
    assert "not below" in eos.missing_eos_note(torch.tensor([1.0, 0.0, 0.0, 0.0]), finished, 0.0)
    assert "no finished-but-wrong" in eos.missing_eos_note(torch.tensor([1.0, 1.0, 0.0, 0.0]), finished, 1.0)
    assert "changes nothing" in eos.missing_eos_note(torch.tensor([1.0, 0.0]), torch.tensor([True, True]), 1.0)


def test_tis_reading_calls_tis_a_repair_only_after_a_measured_harm():
    from workbench.experiments.statistics import Effect
    from workbench.pitfalls import nb12_logprob_mismatch as rm

    def e(diff, larger, bug=0.4, fix=0.4):
        return Effect("heldout_accuracy", bug, fix, diff, 0.003, 3, larger)

    assert "not a repair" in rm.tis_reading(e(-0.004, False), e(-0.015, True, 0.435, 0.45), e(-0.011, True))
    assert "does not change" in rm.tis_reading(e(-0.05, True), e(0.001, False), e(0.05, True))
    assert "brings it to the fp32" in rm.tis_reading(e(-0.05, True), e(-0.05, True), e(0.0, False))
    assert "not to the fp32" in rm.tis_reading(e(-0.05, True), e(-0.02, True), e(0.03, True))


def test_throughput_note_counts_tokens_and_entries():
    from workbench.pitfalls import nb02_right_padding_flash_attention as padding

    note = padding.throughput_note([10, 2, 2, 2], 2.5)  # padded: 40 tokens, 400 entries; packed: 16 tokens, 256 entries
    assert "2.50× the tokens" in note and "0.64× the attention" in note and "dominates" not in note
    note = padding.throughput_note([40] + [2] * 30, 2.0)  # padded 1240 tokens / 100 packed; entries 49600 vs 10000 → 0.2×
    assert "12.40× the tokens" in note
    assert "dominates" in padding.throughput_note([100] + [90] * 31, 1.2)  # dense packed mask has more entries


def test_dropout_step0_note_reads_median_and_max():
    from workbench.pitfalls import nb07_dropout as dropout

    def r(mx, med):
        return {"max_ratio_deviation": mx, "median_abs_log_ratio": med, "tokens": 200}

    jumpy = {(0.0, False): r(1e-6, 1e-7), (0.05, False): r(203.0, 0.08), (0.1, False): r(7.9, 0.9), (0.1, True): r(1e-6, 1e-7)}
    note = dropout.step0_note(jumpy)
    assert "(rises with" in note and "heavy-tail extreme" in note
    steady = {(0.0, False): r(1e-6, 1e-7), (0.1, False): r(7.9, 0.9)}
    assert "heavy-tail" not in dropout.step0_note(steady)
    assert "does not rise" in dropout.step0_note({(0.0, False): r(1.0, 0.5), (0.1, False): r(2.0, 0.1)})
