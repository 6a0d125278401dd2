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


def test_audit_plot_labels_zero_bars_floor_and_keeps_the_whole_title():
    from workbench.audit.result import AuditResult

    long = "chosen prompts only (rejected rows keep their prompt: zip over B lengths for 2B rows)"
    bars = AuditResult("dpo_mask", False, long, {"plot": {"kind": "bar", "x": ["c0", "r0"],
                                                          "series": {"counted": [0, 3], "targets": [3, 3]}}})
    fig, (ax1, ax2) = plt.subplots(1, 2)
    bars.plot(ax1)
    assert [t.get_text() for t in ax1.texts] == ["0"]
    assert ax1.get_title().replace("\n", " ").endswith("2B rows)")
    line = AuditResult("step0", True, "off", {"plot": {"kind": "line", "x": [1, 2], "series": {"d": [0.0, 1e-3]}, "log": True}})
    line.plot(ax2)
    assert any("exactly 0, drawn at 1e-09" in t.get_text() for t in ax2.texts)
    plt.close(fig)


def test_short_name_drops_seed_count_and_names_bug_or_fix():
    assert figure_notes.short_name("scored as finished (bug) (n=3)") == "the bug"
    assert figure_notes.short_name("zero reward without EOS (n=3)") == "zero reward without EOS"


def test_peer_lab_s5_panel_draws_one_probe_coloured_by_convention():
    from workbench.peers import expectations as peer_lab
    from workbench.viz import plots

    def row(probe, mode, value, loss_type=None, norm=None):
        details = {"mode": mode, "value": value, **({"norm_constant": norm} if norm else {})}
        return {"probe": probe, "measured": {"loss_type": loss_type}, "audit": {"details": details}}

    payloads = {"trl-0.15.2": {"rows": [row("s5_zero_loss", "", 0.0), row("aggregation", "seq-mean-token-mean", 0.0)]},
                "trl-0.16.1": {"rows": [row("s5_zero_loss", "", 0.278), row("aggregation", "token-mean", 0.3824)]},
                "trl-1.16": {"rows": [row("aggregation", "token-mean", 0.3824, "dapo"),
                                      row("aggregation", "seq-mean-token-sum-norm", 0.2031, "dr_grpo", 32.0)]}}
    bars = peer_lab.s5_bars(payloads)
    assert [b["value"] for b in bars] == [0.0, 0.3824, 0.3824, 0.2031]  # the s5_zero_loss rows are not mixed in
    fig, ax = plt.subplots()
    peer_lab.plot_s5(ax, payloads)
    colors = [p.get_facecolor() for p in ax.patches]
    assert colors[1] == colors[2] != colors[3]  # 0.16.1 and 1.16 dapo: same convention, same colour
    assert matplotlib.colors.to_rgba(plots.BUG_COLOR) not in colors
    assert any("C = B × 8" in t.get_text() for t in ax.texts)
    plt.close(fig)
