"""Notebook 90's module (``workbench.peers.expectations``): its figures, explorer and the metrics the notebook writes,
fed measured rows shaped like the adapters' (the released peers themselves: tests/peers/test_peer_lab.py)."""

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
from helpers import written_metrics  # noqa: E402

from workbench.peers import expectations as peer_lab  # noqa: E402


def eos_row(generated: int, needed: int) -> dict:
    return {"probe": "s3_eos_stopping", "measured": {"tokens_generated_per_row": generated, "longest_needed": needed,
                                                     "max_new_tokens": 32, "wasted_tokens": 4 * (generated - needed)}}


PAYLOADS = {"trl-0.11.4": {"rows": [eos_row(32, 3)], "environment": {"trl": "0.11.4"}},
            "trl-1.16-eos": {"rows": [eos_row(3, 3)], "environment": {"trl": "1.16.0"}}}
ROWS = [peer_lab.judge("trl", "0.11.4", PAYLOADS["trl-0.11.4"]["rows"][0]),
        peer_lab.judge("trl", "1.16.0", PAYLOADS["trl-1.16-eos"]["rows"][0])]


def test_seed_figure_explorer_redraws_for_another_seed():
    explorer = peer_lab.seed_figure_explorer(ROWS, PAYLOADS)
    assert explorer.last["bars"] == 4 and len(explorer.last["rows"]) == 2  # S3: steps and needed, two releases
    explorer.controls["seed"].value = "S2 · flash attention"
    assert explorer.renders == 2 and explorer.last["bars"] == 0 and explorer.last["rows"] == []  # S2 not measured here


def test_figures_draw_measured_and_skipped_panels():
    fig = peer_lab.figure_peer_lab(PAYLOADS)
    assert [len(ax.patches) for ax in fig.axes] == [4, 0, 0]
    plt.close(fig)
    fig, ax = plt.subplots()
    peer_lab.plot_openrlhf_audit(ax, {}, "position_ids")
    assert ax.texts[0].get_text() == "OpenRLHF position_ids: skipped" and not ax.axison
    plt.close(fig)
    fig = peer_lab.figure_openrlhf_s1_s4(PAYLOADS)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_metrics_are_write_metrics_arguments(tmp_path):
    written = written_metrics(peer_lab.metrics(ROWS, PAYLOADS), tmp_path)
    assert (written["reproduced"], written["fixed"]) == peer_lab.verdict(ROWS) == (True, True)
    assert written["headline"]["bug"] == 32 and written["headline"]["fix"] == 3
    assert written["metrics"]["environments"]["trl-0.11.4"] == {"trl": "0.11.4"} and "skipped" not in written["metrics"]
    skipped = [{**ROWS[0], "verdict": peer_lab.SKIPPED, "measured": "no environment"}]
    kwargs = peer_lab.metrics(skipped, {})
    assert kwargs["metrics"]["skipped"].startswith("1 bug/fix probes not measured") and math.isnan(kwargs["headline"]["bug"])
