"""``scripts/gpu_check.py``'s kernels section, dry-run on the CPU with sdpa stand-ins for a flash package: the measure
that filled ``core.attention_backward``'s table sees a backward that drops or corrupts dq (relative error ≈ 1), and a
correct kernel sits at bf16 sdpa's own error. Only the measure is tested here; the numbers come from a GPU."""

import functools
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.DEVICE = "cpu"
    return module


def _dense(q, k, v, causal):
    groups = q.shape[2] // k.shape[2]
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(groups, 2).transpose(1, 2),
                                          v.repeat_interleave(groups, 2).transpose(1, 2), is_causal=causal).transpose(1, 2)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, *, corrupt_dq=False):
    if corrupt_dq:  # the same values, but dq lands one token off: a right forward with a wrong backward
        q = q.detach() + (q.roll(1, 0) - q.roll(1, 0).detach())
    cu = cu_seqlens_q.tolist()
    return torch.cat([_dense(q[None, a:b], k[None, a:b], v[None, a:b], causal)[0] for a, b in zip(cu, cu[1:], strict=False)])


def test_the_kernels_measure_sees_a_wrong_dq_and_passes_a_right_one():
    gpu_check = _script()
    cases = {"varlen hd16 4q/2kv": (4, 2, 16, (9, 14, 5)), "dense hd16 4q/2kv": (4, 2, 16, (2, 12))}
    functions = {"right": (_dense, _varlen), "wrong dq": (_dense, functools.partial(_varlen, corrupt_dq=True))}
    results = gpu_check.kernel_gaps(functions, (9, 14, 5), cases)
    sdpa = results["varlen hd16 4q/2kv/sdpa bf16/contiguous"]
    right = results["varlen hd16 4q/2kv/right/contiguous"]
    wrong = results["varlen hd16 4q/2kv/wrong dq/transposed"]
    assert max(sdpa.values()) < 0.02 and right == sdpa  # the same function: bf16 rounding only
    assert wrong["out"] < 0.02 and wrong["dq"] > 0.5 and wrong["dk"] < 0.02  # the forward agrees, dq does not
    assert len(gpu_check.kernel_map_cases((9, 14, 5))) == 11 * 3 * 2 + 3 * 2 * 2


def test_the_decode_section_compares_all_three_paths_on_a_cpu():
    """The decode section's dry run: plain, static and graphed sampling of the same seed. On a CPU no graph is recorded
    (``cuda_graph`` is ignored) and the graphed side is the static decoder, token for token; a GPU run fills the same
    keys with the recorded graph's agreement and times (docs/GPU.md)."""
    rows = _script().decode_paths("realistic-qwen2")
    assert set(rows) == {"fp32/padded", "fp32/groups", "bf16/padded", "bf16/groups"}
    for row in rows.values():
        assert row["same_tokens"] and row["graphed_vs_static"]["same_tokens"], row
        assert row["graphed_vs_static"]["max_abs_logprob_gap"] == 0.0
        assert row["graph_recorded"] is False and row["graph_under_autocast"] is False
        assert row["seconds_graphed"] > 0
