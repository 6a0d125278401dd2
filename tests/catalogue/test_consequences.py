"""The "Does it matter?" rows: chosen by the recorded numbers, a null with its MDE, on hand-made metrics.json payloads."""

import math

import matplotlib

matplotlib.use("Agg")

from workbench.catalogue import consequences, report  # noqa: E402
from workbench.catalogue.batch import NotebookResult  # noqa: E402


def record(effect, se, larger, direction="+", mde=None, **extra):
    mde = 4.303 * se if mde is None else mde
    return {"consequence": "wrong answers grow longer", "direction": direction, "effect": effect, "se": se, "threshold": 4.303,
            "mde": mde, "larger": larger, "seeds": 3, "task": "scratchpad", "measure": "incorrect_length", "agrees": False, **extra}


PAYLOADS = {
    "05_grpo": {"metrics": {"prediction": record(2.0, 0.1, True)}},  # larger, sign as predicted
    "06_temp": {"metrics": {"prediction": record(-0.5, 0.05, True)}},  # larger, but the bug lowered it
    "11_trunc": {"metrics": {"prediction": record(0.002, 0.001, False, direction="-")}},  # null: MDE 0.0043
    "13_white": {"metrics": {"prediction": record(0.1, "nan", False, mde="nan")}},  # one seed: no noise estimate
    "02_tokens": {"metrics": {"other": 1.0}},  # no prediction: no row
    "99_failed": None,
}


def test_rows_are_chosen_by_the_numbers():
    rows = consequences.consequence_rows(PAYLOADS)
    assert [r["notebook"] for r in rows] == ["05_grpo", "06_temp", "11_trunc", "13_white"]
    by = {r["notebook"]: r for r in rows}
    grpo = by["05_grpo"]
    assert grpo["verdict"] == "as predicted" and grpo["agrees"] and grpo["verdict_text"] == "larger, as predicted"
    assert by["06_temp"]["verdict"] == "opposite" and not by["06_temp"]["agrees"] and by["06_temp"]["larger"]
    assert by["11_trunc"]["verdict"] == "null" and by["11_trunc"]["verdict_text"] == "no effect > 0.0043"
    assert math.isclose(by["11_trunc"]["mde"], 0.004303) and by["11_trunc"]["direction"] == "-"
    assert math.isnan(by["13_white"]["se"]) and by["13_white"]["verdict_text"] == "no effect seen (no noise estimate)"
    assert set(rows[0]) >= {"notebook", "consequence", "task", "direction", "effect", "se", "mde", "verdict"}
    assert consequences.tally(rows) == ("1 of 4 predicted consequences larger than seed noise, as predicted "
                                        "(1 opposite, 2 null)")


def test_a_list_of_predictions_gives_a_row_each_and_cells_never_say_nan():
    two = [record(1.0, 0.1, True), record(0.0, "nan", False, mde="nan")]
    rows = consequences.consequence_rows({"12_tis": {"metrics": {"prediction": two}}})
    assert len(rows) == 2
    assert consequences.cells(rows[0]) == ["12_tis", "wrong answers grow longer", "scratchpad", "+", "1 ± 0.1", "0.43", "3",
                                           "larger, as predicted"]
    assert consequences.cells(rows[1])[4:6] == ["0 ± n/a (not measured)", "n/a (not measured)"]
    one_seed = consequences.consequence_rows({"05": {"metrics": {"prediction": record(0.5, "nan", False, mde="nan", seeds=1)}}})
    assert consequences.cells(one_seed[0])[4:7] == ["0.5 ± n/a (one seed: no noise estimate)",
                                                    "n/a (one seed: no noise estimate)", "1"]
    table = consequences.markdown_table(rows)
    assert table.splitlines()[0].startswith("| notebook | consequence | task |") and table.count("\n") == 3
    assert "nan" not in table.lower()


def test_the_report_shows_the_table_only_when_a_notebook_predicted(tmp_path):
    def result(stem, payload):
        return NotebookResult(stem=stem, purpose="p", out_dir=str(tmp_path / stem), parameters={}, seconds=1.0, ok=True,
                              metrics={"reproduced": True, "fixed": True, **payload})

    page = report.write_report(tmp_path, [result(s, p) for s, p in PAYLOADS.items() if p], total_seconds=1, smoke=False).read_text()
    section = page[page.index("<section id='does-it-matter'>"):page.index("</section>", page.index("does-it-matter"))]
    assert "<h2>Does it matter?</h2>" in section and "minimum detectable effect" in section
    assert "no effect &gt; 0.0043" in section and "larger, opposite to the prediction" in section
    assert section.count("<tr>") == 5 and "1 of 4 predicted consequences" in section  # header + 4 rows
    assert page.index("does-it-matter'>") < page.index('<section id="05_grpo">')  # before the notebooks' sections
    assert "<td>CPU cores</td>" in page
    plain = report.write_report(tmp_path, [result("02_tokens", PAYLOADS["02_tokens"])], total_seconds=1, smoke=False).read_text()
    assert "Does it matter?" not in plain
