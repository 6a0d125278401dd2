"""nb04_dpo_loss_mask: metrics(), figures, the buggy-call message and the loss-mask explorer."""

import pytest
from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.pitfalls import nb04_dpo_loss_mask as dpo_mask
from workbench.trainers.preferences import collate_preferences

PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+3=", "chosen": "15", "rejected": "16"}]
KEYS = ("loss", "rewards/margins", "rewards/accuracies", "logps/prompt")
HELDOUT = ("heldout_accuracy", "heldout_logp_chosen", "heldout_logp_rejected")


@pytest.fixture
def batch(tokenizer):
    return collate_preferences(tokenizer, PAIRS)


def test_metrics_returns_write_metrics_arguments(batch):
    runs = fake_runs(dpo_mask.MODES, KEYS, heldout=HELDOUT)
    audits = dpo_mask.mask_audits(batch)
    kwargs = dpo_mask.metrics(audits=audits, margin_gap_step0=0.0, margin_gap_after=0.5, hand_gap=0.0, runs=runs,
                              effects=dpo_mask.training_effects(runs), train_steps=4)
    check_metrics(kwargs, "04_dpo_loss_mask")
    assert kwargs["reproduced"] and kwargs["fixed"]
    assert kwargs["metrics"]["rows_counting_prompt_tokens"] == {"both": 0, "chosen_only": 2, "none": 4}
    assert "mean over 2 seed(s)" in kwargs["headline"]["what"]


def test_buggy_call_message_names_the_fix(batch):
    assert "prompt_lengths * 2" in dpo_mask.buggy_call_message(batch)


def test_figures_draw(batch):
    assert drew(dpo_mask.figure_loss_masks(batch, dpo_mask.mask_audits(batch)))
    assert drew(dpo_mask.figure_training_bands(fake_runs(dpo_mask.MODES, KEYS)))
    fig, ax = axes(4)
    dpo_mask.plot_training_bands(ax, fake_runs(dpo_mask.MODES, KEYS))
    assert drew(fig)


def test_dpo_mask_explorer_counts_prompt_rows(batch):
    explorer = dpo_mask.dpo_mask_explorer(batch, dpo_mask.mask_audits(batch))
    assert explorer.last["rows_counting_prompt"] == 2  # the bug: the two rejected rows
    explorer.controls["prompt_mask"].value = "both"
    assert explorer.last["rows_counting_prompt"] == 0
    explorer.controls["prompt_mask"].value = "none"
    assert explorer.last["rows_counting_prompt"] == 4


def test_dpo_mask_verdict():
    clean = {"chosen_only": [], "both": []}
    assert dpo_mask.verdict(clean, 0.0, 0.0) == (False, True)
    buggy = {"chosen_only": [{"side": "rejected"}], "both": [{"side": "rejected"}]}
    assert dpo_mask.verdict(buggy, 0.3, 0.0) == (True, False)


def test_dpo_accuracy_conclusion():
    text = dpo_mask.accuracy_conclusion(0.40, {"both": 0.23, "chosen_only": 0.22, "none": 0.23}, 300)
    assert "every mode, the fix included, lowers it" in text and "not larger" in text
    assert "no mode changes it" in dpo_mask.accuracy_conclusion(0.40, {"both": 0.41, "chosen_only": 0.39}, 300)


def test_figures_are_readable_at_notebook_width(batch):
    from workbench.viz import legibility

    runs = fake_runs(dpo_mask.MODES, KEYS, seeds=3, steps=60)
    for fig in (dpo_mask.figure_loss_masks(batch, dpo_mask.mask_audits(batch)), dpo_mask.figure_training_bands(runs)):
        assert fig.get_size_inches()[0] <= 9.6
        assert legibility.check_figure(fig).problems() == []
    assert "seeds" in dpo_mask.training_note(runs) and "rows 2–3" in dpo_mask.loss_masks_note(batch)


def test_heldout_explanation_of_one_seed_prints_no_nan():
    from workbench.experiments import statistics

    runs = fake_runs(dpo_mask.MODES, KEYS, seeds=1, heldout=HELDOUT)
    text = dpo_mask.heldout_explanation(*(statistics.gain(runs, "both", k) for k in HELDOUT))
    assert "nan" not in text and "one seed" in text
