"""figure_notes: hidden series are found and named, separate ones are not; zero bars get a label."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from workbench.viz import plots as figure_notes  # noqa: E402  (the helpers live in workbench.viz.plots)


def test_hidden_line_is_named_and_ringed():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1.0, 2.0, 3.0], "o-", label="sentinel")
    ax.plot([0, 1, 2], [1.0, 2.0, 3.0], "o-", label="masked")
    ax.plot([0, 1, 2], [5.0, 9.0, 1.0], "o-", label="unmasked")
    ax.legend()
    notes = figure_notes.note_coinciding(ax)
    assert notes == [("sentinel (under masked, ringed)", "masked", 3)]
    assert any("under masked" in t.get_text() for t in ax.get_legend().get_texts())
    assert sum(ln.get_label() == "_ring" for ln in ax.get_lines()) == 1
    plt.close(fig)


def test_partial_overlap_counts_points_and_separate_lines_are_left_alone():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1.0, 2.0, 3.0], "o-", label="bug")
    ax.plot([0, 1, 2], [1.0, 5.0, 8.0], "s--", label="disabled (fix)")
    assert figure_notes.note_coinciding(ax) == [("bug (under the fix at 1/3 points, ringed)", "the fix", 1)]
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 1], [0.0, 1.0], label="a")
    ax2.plot([0, 1], [0.5, 0.2], label="b")
    assert figure_notes.note_coinciding(ax2) == []
    assert ax2.get_legend() is None
    plt.close("all")


def test_zero_bars_are_labelled():
    fig, ax = plt.subplots()
    bars = ax.bar([0, 1, 2], [0.0, 0.3, 0.0])
    assert figure_notes.label_zero_bars(ax, bars) == 2
    ax.set_yscale("log")
    bars = ax.bar([3], [0.0])
    assert figure_notes.label_zero_bars(ax, bars) == 1
    plt.close(fig)


def test_short_name_drops_seed_count_and_names_bug_or_fix():
    assert figure_notes.short_name("scored as finished (bug) (n=3)") == "the bug"
    assert figure_notes.short_name("zero reward without EOS (n=3)") == "zero reward without EOS"
