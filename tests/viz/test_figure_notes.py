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


def _runs(bug, fix):
    return {"bug (bug)": [[{"step": i, "m": v} for i, v in enumerate(bug)]],
            "off (fix)": [[{"step": i, "m": v} for i, v in enumerate(fix)]]}


def test_plot_bands_log_floor_is_two_decades_down_and_the_legend_says_exactly_zero():
    fig, ax = plt.subplots()
    figure_notes.plot_bands(ax, _runs([450.0, 4e5, 4e4], [0.0, 0.0, 0.0]), "m", "deviation", log=True)
    fix_line = next(ln for ln in ax.get_lines() if str(ln.get_label()).startswith("off (fix)"))
    floor = float(fix_line.get_ydata()[0])
    assert floor == 1.0  # 450 → 10^(2 − 2): 2.65 decades under the smallest positive value
    assert "exactly 0, drawn at 1e+00" in fix_line.get_label()
    assert ax.get_ylim()[0] < floor / 2  # room under the floor line for its note
    notes = [t for t in ax.texts if "exactly 0 at every step" in t.get_text()]
    assert len(notes) == 1 and notes[0].get_text().startswith("the fix")
    plt.close(fig)


def test_plot_bands_and_plot_curves_say_a_series_hidden_under_another():
    fig, (ax1, ax2) = plt.subplots(1, 2)
    figure_notes.plot_bands(ax1, _runs([0.2, 0.3, 0.1], [0.2, 0.3, 0.1]), "m", "reward")
    assert any("(under the bug, ringed)" in t.get_text() for t in ax1.get_legend().get_texts())
    first_seed = {label: runs[0] for label, runs in _runs([0.2, 0.3], [0.2, 0.3]).items()}
    figure_notes.plot_curves(ax2, first_seed, "m", "reward")
    assert any("(under the bug, ringed)" in t.get_text() for t in ax2.get_legend().get_texts())
    assert figure_notes.note_coinciding(ax2) == []  # already said: not said twice
    plt.close(fig)


def test_reference_lines_neither_hide_nor_are_hidden():
    fig, ax = plt.subplots()
    ax.plot([1.0, 2.0], [1.0, 1.0], "s-", label="global count (fix)")
    ax.axhline(1.0, ls=":", label="single process: 1/N")  # x in axes fractions [0, 1]: not data x
    assert figure_notes.note_coinciding(ax) == []
    plt.close(fig)


def test_short_name_keeps_a_long_label_whole():
    label = "block-diagonal 4-D mask (fix, explicit)"
    assert figure_notes.short_name(label) == label


def test_grid_labels_are_dark_on_pale_cells_and_light_on_dark_ones():
    fig, ax = plt.subplots()
    image = ax.imshow([[-9.0, 0.0]], cmap="magma_r", vmin=-9, vmax=0)
    figure_notes.annotate_grid(ax, [["0", "1e+00"]], image=image)
    assert [t.get_color() for t in ax.texts] == ["black", "white"]
    plt.close(fig)


def test_a_fix_coloured_run_is_tagged_in_the_legend_without_renaming_it():
    assert figure_notes.tagged("fp32 rollout", figure_notes.FIX_COLOR) == "fp32 rollout (fix)"
    assert figure_notes.tagged("scored as finished (bug)", figure_notes.BUG_COLOR) == "scored as finished (bug)"
    assert figure_notes.tagged("bf16 rollout + TIS", figure_notes.SERIES_COLORS[2]) == "bf16 rollout + TIS"
    assert figure_notes.tagged("prefix (fixed seed)", figure_notes.FIX_COLOR) == "prefix (fixed seed) (fix)"


def test_ring_only_rings_and_leaves_labels_and_legend_alone():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1, 2, 3], "o-", label="bug")
    ax.plot([0, 1, 2], [1, 2, 3], "s-", label="fix")
    notes = figure_notes.note_coinciding(ax, ring_only=True)
    assert [note[0] for note in notes] == ["bug"] and ax.get_legend() is None
    assert [line.get_label() for line in ax.get_lines()] == ["bug", "fix", "_ring"]
    plt.close(fig)
