"""nb28_async_staleness: a real k-step lag on the tiny model, the ratio each denominator shows, the verdict both ways,
metrics(), figures and the explorer."""

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb28_async_staleness as st
from workbench.tasks import rl_problems
from workbench.viz import legibility


@pytest.fixture(scope="module")
def rows():
    policy, tokenizer = load("tiny-arith-qwen2")
    problems = rl_problems(24)
    return st.lag_sweep(policy, tokenizer, problems[:16], problems[16:], [0, 2], lr=1e-3, clip=0.2, seed=0)


def test_a_lag_moves_the_actor_away_from_the_sampler_and_the_recomputed_ratio_hides_it(rows):
    fresh, stale = rows
    assert fresh["mean_abs_gap"] < 1e-5  # lag 0: the sampler's log-probs are the actor's (fp32 both)
    assert stale["mean_abs_gap"] > 1e-3 and stale["true_clip_fraction"] > 0  # the signature: the actor moved, the clip should act
    assert stale["clip_fraction_recomputed"] == 0  # switch on (bug): the loss sees ratio 1 everywhere
    assert stale["clip_fraction_sampler"] == stale["true_clip_fraction"]  # switch off (fix): the true ratio
    assert stale["max_weight_error_sampler"] < 1e-6 < stale["max_weight_error_recomputed"]
    assert st.verdict(rows) == (True, True)


def synthetic_row(lag: int, shift: float) -> dict:
    mu = torch.full((1, 8), -1.0)
    return st.staleness_row(lag, mu, mu + torch.linspace(-shift, shift, 8).view(1, 8), torch.ones(1, 8), 0.2)


def test_verdict_is_false_without_staleness():
    synchronous = [synthetic_row(0, 0.0), synthetic_row(4, 0.0)]  # the actor never moved: nothing to hide
    assert st.verdict(synchronous) == (False, True)
    head = st.headline_row(synchronous)
    assert head is synchronous[1] and "raise the learning rate" in st.headline_sentence(synchronous, head, 0.2)
    assert "did not move this checkpoint's actor" in st.not_shown(head) and st.metrics(synchronous, head, 0.2)["not_shown"]
    stale = [synthetic_row(0, 0.0), synthetic_row(4, 0.5)]
    assert st.verdict(stale) == (True, True) and st.not_shown(st.headline_row(stale)) is None
    assert stale[1]["true_clip_fraction"] == pytest.approx(5 / 8)  # outside (log 0.8, log 1.2) = (−0.223, 0.182): ±0.5, ±0.357, +0.214


def test_ppo_ratio_names_its_switch():
    with pytest.raises(ValueError, match="denominator"):
        st.ppo_ratio(torch.zeros(2), torch.zeros(2), torch.zeros(2), "behaviour")


def test_metrics_figures_and_explorer(rows, tmp_path):
    head = st.headline_row(rows)
    kwargs = st.metrics(rows, head, 0.2)
    check_metrics(kwargs, "28_async_staleness")
    assert kwargs["headline"]["bug"] == 0 and kwargs["headline"]["fix"] == rows[-1]["true_clip_fraction"]
    assert all("log_ratio" not in r for r in kwargs["metrics"]["lags"])  # tensors stay out of metrics.json
    fig = st.figure_staleness(rows, head, 0.2)
    assert legibility.check_figure(fig).problems() == []
    assert f"lag {head['lag']}" in st.staleness_note(rows, head, 0.2)
    assert drew(fig)
    assert len(st.sweep_lines(rows, 0.2).splitlines()) == len(rows)
    explorer = st.staleness_explorer(rows, 0.2)
    assert explorer.renders == 1 and explorer.last["lag"] == 2
    explorer.controls["epsilon"].value = 0.01
    assert explorer.renders == 2 and explorer.last["true_clip_fraction"] >= rows[-1]["true_clip_fraction"]
