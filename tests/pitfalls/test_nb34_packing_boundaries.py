"""nb34_packing_boundaries: a 2-D all-ones mask lets packed segments see each other, position ids alone or a
block-diagonal mask keep them apart; the verdict, figures, explorer and metrics."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.modeling.tiny import tiny_model
from workbench.pitfalls import nb34_packing_boundaries as pb

SEGMENTS = [[3, 5, 7, 9, 11], [4, 6, 8, 10], [12, 13, 14, 15, 16, 17]]


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", attn_implementation="sdpa")[0]


@pytest.fixture(scope="module")
def errors(model):
    return pb.boundary_errors(model, SEGMENTS)


def test_pack_restarts_positions_and_the_block_mask_is_block_diagonal():
    packed = pb.pack([[1, 2], [3, 4, 5]])
    assert packed["position_ids"].tolist() == [[0, 1, 0, 1, 2]] and packed["segment"].tolist() == [0, 0, 1, 1, 1]
    allowed = pb.block_mask(packed["segment"])[0, 0] == 0
    assert allowed[3].tolist() == [False, False, True, True, False]  # token 1 of segment 1 sees only its own past


def test_two_d_mask_leaks_the_earlier_segments(errors):
    bug = errors[pb.BUG]
    assert bug[0]["max"] < 1e-5  # the first segment has nothing before it
    assert min(s["max"] for s in bug[1:]) > 1e-3  # every later segment sees its neighbours


def test_position_ids_alone_and_the_block_mask_keep_the_boundaries(errors):
    for mask in pb.MASKS[1:]:
        assert max(s["max"] for s in errors[mask]) < 1e-4, mask
    assert pb.verdict(errors) == (True, True)


def test_verdict_is_false_on_bug_free_numbers(errors):
    clean = dict(errors, **{pb.BUG: errors[pb.FIX]})  # the 2-D mask path behaving like the fixed one
    assert pb.verdict(clean) == (False, True)
    with pytest.raises(ValueError, match="mask must be one of"):
        pb.packed_logprobs(tiny_model("qwen2")[0], pb.pack(SEGMENTS), "3-D")


def test_the_sweep_takes_the_measured_pack_of_every_segment(model, errors):
    assert pb.segment_sweep(model, SEGMENTS, [2, 3], errors=errors) == pb.segment_sweep(model, SEGMENTS, [2, 3])


def test_segments_scored_alone_once_give_the_same_errors_and_sweep(model, errors):
    alone = [pb.alone_logprobs(model, s) for s in SEGMENTS]
    assert pb.boundary_errors(model, SEGMENTS, alone=alone) == errors
    assert pb.segment_sweep(model, SEGMENTS, [2, 3], alone=alone) == pb.segment_sweep(model, SEGMENTS, [2, 3])


def test_metrics_figures_lines_and_explorer(model, errors):
    rows = pb.segment_sweep(model, SEGMENTS, [1, 3])
    assert rows[0][pb.BUG]["mean"] == 0.0 and rows[1][pb.BUG]["mean"] > 1e-4
    kwargs = pb.metrics(errors, rows)
    check_metrics(kwargs, "34_packing_boundaries")
    assert kwargs["headline"]["bug"] > 1e-3 > kwargs["headline"]["fix"]
    assert drew(pb.figure_packing(errors, rows))
    assert len(pb.error_lines(errors).splitlines()) == 3 and len(pb.sweep_lines(rows).splitlines()) == 2
    explorer = pb.pack_explorer(model, SEGMENTS)
    assert explorer.renders == 1 and list(explorer.last) == [pb.BUG]
    explorer.controls["mask"].value = pb.FIX
    assert explorer.renders == 2 and max(s["max"] for s in explorer.last[pb.FIX]) < 1e-4
    assert torch.is_tensor(pb.alone_logprobs(model, SEGMENTS[0]))
