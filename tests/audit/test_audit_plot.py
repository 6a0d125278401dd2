"""AuditResult.plot: the figure an audit result draws (labelled zero bars, the log floor, the whole title)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from workbench.audit import result  # noqa: E402
from workbench.audit.result import AuditResult  # noqa: E402
from workbench.viz import plots  # noqa: E402


def test_audit_plot_labels_zero_bars_floor_and_keeps_the_whole_title():
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


def test_audit_colours_are_the_plot_style_colours():
    assert (result.FAIL_COLOR, result.PASS_COLOR, result.NEUTRAL_COLOR) == (plots.BUG_COLOR, plots.FIX_COLOR, plots.NEUTRAL_COLOR)
