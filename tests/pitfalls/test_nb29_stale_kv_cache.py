"""nb29_stale_kv_cache: the engine's prefix cache (a hit decodes on old keys/values), a weight change by hand with each
cache policy, a real sweep of REINFORCE updates on the tiny model, the verdict both ways, metrics(), figures, explorer."""

import copy

import pytest
import torch
from pitfall_fakes import check_metrics, drew

from workbench.experiments.checkpoints import load
from workbench.pitfalls import nb29_stale_kv_cache as kv
from workbench.tasks import rl_problems
from workbench.viz import legibility


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-arith-qwen2")


def perturbed(model, scale: float = 0.05):
    """A copy of ``model`` with every weight moved by ``scale`` × a fixed random direction: a weight update by hand."""
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return moved


def test_a_cache_hit_decodes_on_the_weights_that_filled_it(tiny):
    model, tokenizer = tiny
    problems = rl_problems(2)
    serve = dict(group_size=2, max_new_tokens=4, seed=0)
    for policy, stale in (("keep", True), ("invalidate", False)):
        cache = kv.PrefixCache(policy)
        first = kv.serve_and_score(model, tokenizer, cache, problems[:1], version=0, **serve)
        assert first["hit_rate"] == 0 and first["max_gap"] < 1e-4  # a miss: engine and trainer agree (fp32 both)
        again = kv.serve_and_score(model, tokenizer, cache, problems[:1], version=0, **serve)
        assert again["hit_rate"] == 1 and again["max_gap"] < 1e-4  # a hit with unchanged weights is exact too
        cache.on_weight_update()
        new_weights = perturbed(model)
        repeated = kv.serve_and_score(new_weights, tokenizer, cache, problems[:1], version=1, **serve)
        new = kv.serve_and_score(new_weights, tokenizer, cache, problems[1:], version=1, **serve)
        assert new["hit_rate"] == 0 and new["max_gap"] < 1e-4  # never-seen prompts are served fresh by both policies
        if stale:  # switch on (bug): the old prefix under the new weights
            assert repeated["hit_rate"] == 1 and repeated["kv_age"] == 1 and repeated["mean_gap"] > 1e-3
        else:  # switch off (fix): the update emptied the cache, the prompt is prefilled by the new weights
            assert repeated["hit_rate"] == 0 and repeated["kv_age"] == 0 and repeated["max_gap"] < 1e-4


def test_the_cache_entry_is_never_extended_by_decoding(tiny):
    model, tokenizer = tiny
    cache = kv.PrefixCache("keep")
    kv.serve_and_score(model, tokenizer, cache, rl_problems(1), version=0, group_size=3, max_new_tokens=4, seed=0)
    (entry, filled_at), = cache.entries.values()
    prompt_length = len(next(iter(cache.entries)))
    assert entry.get_seq_length() == prompt_length - 1 and filled_at == 0  # all prompt tokens but the last, one row


def test_bad_policy_and_small_pool_name_the_problem(tiny):
    with pytest.raises(ValueError, match="cache policy"):
        kv.PrefixCache("reset")
    model, tokenizer = tiny
    problems = rl_problems(8)
    with pytest.raises(ValueError, match="new_pool"):
        kv.update_sweep(model, tokenizer, problems[:4], problems[4:6], problems[6:], [0, 2])


@pytest.fixture(scope="module")
def rows(tiny):
    model, tokenizer = tiny
    problems = rl_problems(4 * 3 + 8)
    return kv.update_sweep(model, tokenizer, problems[:4], problems[4:12], problems[12:], [0, 2], lr=1e-4, clip=0.2, seed=0)


def test_the_gap_on_repeated_prompts_grows_with_the_updates_only_when_the_cache_is_kept(rows):
    fresh, stale = rows
    assert fresh["keep"]["repeated_max_gap"] < 1e-4 and fresh["keep"]["repeated_hit_rate"] == 1  # no update yet
    keep, inv = stale["keep"], stale["invalidate"]
    assert keep["repeated_hit_rate"] == 1 and keep["kv_age"] == 2 and keep["repeated_gap"] > 1e-3  # the signature
    assert keep["new_max_gap"] < 1e-4  # misses are exact: the stale prefix is the cause
    assert inv["repeated_hit_rate"] == 0 and inv["kv_age"] == 0 and inv["repeated_max_gap"] < 1e-4  # the fix
    assert keep["outside_clip"] >= inv["outside_clip"] == 0
    assert kv.verdict(rows) == (True, True)


def not_shown(rows: list[dict]) -> str | None:
    return kv.not_shown(rows, kv.headline_row(rows))


def metrics(rows: list[dict]) -> dict:
    return kv.metrics(rows, kv.headline_row(rows), 0.2)


def test_the_sweep_records_how_far_the_updates_moved_the_weights(rows, tiny):
    fresh, stale = rows
    assert fresh["weight_change"] == 0 and fresh["train_responses"] == 0  # before any update
    assert stale["weight_change"] > 1e-5 and stale["train_responses"] == 16 and stale["train_rewarded"] > 0  # the tiny model learns
    assert not_shown(rows) is None and metrics(rows)["not_shown"] is None
    assert metrics(rows)["metrics"]["updates"][1]["weight_change"] == stale["weight_change"]
    model, _ = tiny
    assert kv.weight_change(model, model) == 0 and kv.weight_change(perturbed(model, 0.5), model) > 0.1


def test_a_checkpoint_that_earns_no_reward_records_why_it_cannot_show_a_stale_cache():
    """An untrained model never answers (reward 0 everywhere, like the realistic checkpoints): R − mean R = 0, the
    REINFORCE updates leave every weight as it was, the kept cache is not stale, and the notebook says so."""
    from workbench.modeling.tiny import tiny_model

    untrained, tokenizer = tiny_model("qwen2")
    problems = rl_problems(4 * 3 + 8)
    rows = kv.update_sweep(untrained, tokenizer, problems[:4], problems[4:12], problems[12:], [0, 2], lr=1e-4, clip=0.2, seed=0)
    assert rows[-1]["train_rewarded"] == 0 and rows[-1]["weight_change"] == 0 and rows[-1]["keep"]["repeated_max_gap"] < 1e-4
    assert kv.verdict(rows) == (False, True)
    reason = metrics(rows)["not_shown"]
    assert "left this checkpoint's weights exactly as they were" in reason and "none of them earned a reward" in reason


def synthetic(updates: int, keep_gap: float, invalidate_gap: float = 1e-7, new_gap: float = 1e-7) -> dict:
    def policy(gap):
        return {"repeated_gap": gap, "repeated_max_gap": 3 * gap, "repeated_hit_rate": 1.0, "kv_age": updates, "new_gap": new_gap,
                "new_max_gap": 3 * new_gap, "new_hit_rate": 0.0, "log_ratio": torch.full((4,), gap), "outside_clip": 0.0}
    return {"updates": updates, "keep": policy(keep_gap), "invalidate": policy(invalidate_gap)}


def test_verdict_is_false_on_bug_free_numbers_and_not_fixed_when_invalidation_fails():
    clean = [synthetic(0, 1e-7), synthetic(8, 1e-7)]  # the weights never moved, or the engine never caches
    assert kv.verdict(clean) == (False, True)
    assert "raise the learning rate" in kv.headline_sentence(clean, kv.headline_row(clean), 0.2)
    assert not_shown(clean) is None  # no record of the weights: a failed reproduction, not a blind spot
    frozen = [{**r, "weight_change": 0.0, "train_responses": 8 * r["updates"], "train_rewarded": 8 * r["updates"]} for r in clean]
    assert "8 REINFORCE update(s)" in not_shown(frozen) and "64 of them earned a reward" in not_shown(frozen)
    moved = [{**r, "weight_change": 1e-3, "train_responses": 8, "train_rewarded": 2} for r in clean]
    assert not_shown(moved) is None  # the weights moved and nothing showed: that must fail, not be excused
    noisy_misses = [synthetic(0, 1e-7, new_gap=1e-2), synthetic(8, 5e-2, new_gap=1e-2)]  # a gap everywhere: not the cache
    assert kv.verdict(noisy_misses)[0] is False
    assert kv.verdict([synthetic(0, 1e-7), synthetic(8, 5e-2)]) == (True, True)
    assert kv.verdict([synthetic(0, 1e-7), synthetic(8, 5e-2, invalidate_gap=5e-2)]) == (True, False)


def test_metrics_figures_and_explorer(rows):
    kwargs = metrics(rows)
    check_metrics(kwargs, "29_stale_kv_cache")
    assert kwargs["headline"]["bug"] == rows[-1]["keep"]["repeated_gap"] > 1e-3 > 1e-4 > kwargs["headline"]["fix"]
    assert all("log_ratio" not in r[p] for r in kwargs["metrics"]["updates"] for p in kv.CACHE_POLICIES)  # no tensors
    fig = kv.figure_stale_cache(rows, kv.headline_row(rows), 0.2)
    assert legibility.check_figure(fig).problems() == []
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert labels[:2] == ["repeated, cache kept (bug)", "repeated, invalidated (fix)"] and not any("(under" in t for t in labels)
    assert drew(fig)
    note = kv.stale_cache_note(rows, kv.headline_row(rows), 0.2)
    assert "ε = 0.2" in note and "k = 2 updates" in note
    assert len(kv.sweep_lines(rows, 0.2).splitlines()) == 2 * len(rows)
    explorer = kv.stale_cache_explorer(rows, 0.2)
    assert explorer.renders == 1 and explorer.last["updates"] == 2 and explorer.last["outside_clip_invalidate"] == 0
    explorer.controls["epsilon"].value = 0.01
    assert explorer.renders == 2 and explorer.last["outside_clip_keep"] >= rows[-1]["keep"]["outside_clip"]
