"""``modeling.draw.multinomial_one`` is ``torch.multinomial(probs, 1)``: the same tokens, the same generator state.

* its exponential variates are ``exponential_``'s bitwise, including the rare elements next to a float32 rounding
  midpoint that it recomputes with the C library's ``log1p`` (seeds 2 and 38 at 8 × 32,000 have one each);
* its tokens and the generator's state afterwards equal ``torch.multinomial``'s over seeds, shapes, peaked and
  flat distributions and zero-probability entries (a top-k filter's), with the global generator too;
* rows are drawn in chunks that fit a core's L2 cache (5 × 20,000: chunks of 3 and 2 rows), in the generator's order;
* what it does not replicate (float64 or non-contiguous probabilities, small tensors) goes to ``torch.multinomial``.
"""

import pytest
import torch

from workbench.modeling import draw
from workbench.modeling.draw import multinomial_one

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)


def _near_midpoint(seed, shape):
    """How many of this seed's variates the fast path recomputes with ``math.log1p``."""
    bits = torch.empty(shape, dtype=torch.int64).random_(generator=torch.Generator().manual_seed(seed))
    q = bits.bitwise_and_(draw._MANTISSA_53).double().mul_(2.0**-53).neg_().log1p_().neg_()
    return int(q.view(torch.int64).add(draw._SHIFT).bitwise_and_(draw._DROPPED).le_(2 * draw._MARGIN).sum())


@pytest.mark.parametrize("seed", [0, 1, 2, 38])
def test_exponential_variates_are_exponential_s_bitwise(seed):
    shape = (8, 32000)
    expected = torch.empty(shape).exponential_(generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed)
    assert torch.equal(draw._exponential(shape, generator), expected)
    assert torch.equal(generator.get_state(), _state_after_exponential(seed, shape))
    assert _near_midpoint(seed, shape) == (1 if seed in (2, 38) else 0)  # the recomputed path runs for 2 and 38


def _state_after_exponential(seed, shape):
    generator = torch.Generator().manual_seed(seed)
    torch.empty(shape).exponential_(generator=generator)
    return generator.get_state()


def _probabilities(rows, vocab, sharpness, seed, zeros=False):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(10_000 + seed)) * sharpness
    if zeros:  # a top-k filter's -inf entries: probability exactly 0
        logits[:, vocab // 2:] = float("-inf")
    return torch.log_softmax(logits, -1).exp()


@pytest.mark.parametrize("rows,vocab,seeds", [(1, 7, 12), (16, 64, 12), (3, 1000, 12), (5, 20000, 3), (8, 32000, 3)])
@pytest.mark.parametrize("sharpness", [0.1, 1.0, 8.0])
def test_tokens_and_generator_state_equal_torch_multinomial(rows, vocab, seeds, sharpness):
    for seed in range(seeds):
        probs = _probabilities(rows, vocab, sharpness, seed, zeros=seed % 3 == 0)
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(multinomial_one(probs, a), torch.multinomial(probs, 1, generator=b).squeeze(-1))
        assert torch.equal(a.get_state(), b.get_state())


def test_global_generator_and_fallback():
    probs = _probabilities(4, 500, 1.0, 0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        fast = multinomial_one(probs)
        after_fast = torch.rand(3)
        torch.manual_seed(3)
        plain = torch.multinomial(probs, 1).squeeze(-1)
        after_plain = torch.rand(3)
    assert torch.equal(fast, plain) and torch.equal(after_fast, after_plain)
    for other in (probs.double(), _probabilities(20000, 4, 1.0, 1).t()):  # float64, non-contiguous: torch.multinomial
        a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        assert torch.equal(multinomial_one(other, a), torch.multinomial(other, 1, generator=b).squeeze(-1))


def test_the_exact_path_when_the_winner_is_not_alone(monkeypatch):
    """Every element a contender (margin 1): the whole q computed exactly, still torch.multinomial's tokens."""
    monkeypatch.setattr(draw, "_CONTENDER_MARGIN", 1.0)
    for seed in (0, 2, 38):  # 2 and 38: a variate next to a float32 rounding midpoint, recomputed
        probs = _probabilities(8, 32000, 1.0, seed)
        a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(multinomial_one(probs, a), torch.multinomial(probs, 1, generator=b).squeeze(-1))
        assert torch.equal(a.get_state(), b.get_state())
