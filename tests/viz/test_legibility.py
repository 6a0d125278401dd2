"""viz.legibility: each problem it reports is found on a figure built to have it, and not on one built without it."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from workbench.viz import legibility, plots  # noqa: E402


@pytest.fixture(autouse=True)
def style():
    plots.apply_style()
    yield
    plt.close("all")


def test_a_notebook_width_figure_is_readable():
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([0, 1, 2], [1, 3, 2], label="bug")
    ax.set(xlabel="training step", ylabel="loss", title="one panel")
    ax.legend()
    check = legibility.check_figure(fig, "plain")
    assert check.problems() == [], check.problems()
    assert check.scale == 1.0 and 500 <= check.width_px <= 720  # at most 7 in at 100 dpi: the tight box and its pads


def test_a_wide_row_shrinks_its_text_under_the_size():
    fig, axes = plt.subplots(1, 4, figsize=(22, 4))
    for ax in axes:
        ax.plot([0, 1], [0, 1])
        ax.set_xlabel("step")
    fig.tight_layout()
    check = legibility.check_figure(fig, "wide")
    assert check.scale < 0.5
    assert check.small_texts and check.smallest_shown_pt == pytest.approx(10 * check.scale, rel=0.02)  # 10-pt ticks
    assert "under 8 pt" in check.problems()[0]


def test_a_small_font_is_small_at_any_width():
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.text(0.5, 0.5, "tiny note", fontsize=6)
    check = legibility.check_figure(fig)
    assert check.small_texts == ["'tiny note' 6.0 pt"]


def test_overlapping_texts_and_a_legend_over_tick_labels_are_found():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.text(0.5, 0.5, "first label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "second label", transform=ax.transAxes)
    assert any("'first label' over 'second label'" in o for o in legibility.check_figure(fig).overlaps)

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1], [0, 1], label="a long series name")
    ax.legend(loc="upper left", bbox_to_anchor=(-0.15, 0.05))  # down onto the x tick labels
    overlaps = legibility.check_figure(fig).overlaps
    assert any(o.startswith("a legend over") for o in overlaps), overlaps


def test_crowded_tick_labels_overlap():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(30), [f"label {i}" for i in range(30)])
    assert legibility.check_figure(fig).overlaps


def test_a_log_axis_over_a_flat_range_repeats_its_label():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(np.arange(5), np.full(5, 3.44828e-2) * (1 + np.arange(5) * 1e-9))
    ax.set_yscale("log")
    check = legibility.check_figure(fig)
    assert check.repeated_ticks and check.repeated_ticks[0].startswith("axes 0 y"), check.as_dict()


def test_labels_the_figure_wrote_may_repeat():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(range(4), [1, 2, 3, 4])
    ax.set_xticks(range(4), ["+", "1", "+", "2"])  # tokens: a repeat is the data's
    assert legibility.check_figure(fig).repeated_ticks == []


def test_tick_labels_outside_the_view_are_not_counted():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1], [0, 1])
    ax.set_xlim(0.2, 0.4)
    check = legibility.check_figure(fig)
    assert check.problems() == []
