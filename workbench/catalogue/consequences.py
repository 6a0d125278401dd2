"""The "Does it matter?" table: one row per training consequence a notebook predicted, with its power.

A training notebook records the consequence its mechanism predicts, stated before the run, as
``metrics["prediction"]`` (``experiments.statistics.prediction``): the predicted sign of
bug − fix, the measured effect ± s.e. over seeds, the t threshold, the minimum detectable effect (MDE)
and whether the effect was larger than the noise. This module turns those records into rows, chosen
by the numbers only:

* **as predicted** — larger than the noise, with the predicted sign;
* **opposite** — larger than the noise, with the other sign;
* **null** — not larger: "no effect > <MDE>" (the largest effect these seeds rule out), or "no noise
  estimate" when there is none (one seed).

Pure functions over plain ``metrics.json`` payloads: the HTML report (``report.py``) and
``scripts/learning_report.py`` (the table in ``docs/LEARNING.md``) render the same rows.
"""

from __future__ import annotations

from workbench.core.numbers import shown, why_undefined
from workbench.experiments import statistics

VERDICTS = statistics.PREDICTION_VERDICTS


def predictions_of(payload: dict) -> list[dict]:
    """The prediction records of one notebook's ``metrics.json`` payload (``payload["metrics"]["prediction"]``,
    one record or a list of them); none when it records no prediction."""
    records = ((payload or {}).get("metrics") or {}).get("prediction")
    if records is None:
        return []
    return [r for r in (records if isinstance(records, list) else [records]) if isinstance(r, dict)]


def verdict_of(record: dict) -> tuple[str, str]:
    """``(kind, text)``: kind one of ``VERDICTS``, text what the table shows (``statistics.prediction_verdict``)."""
    return statistics.prediction_verdict(record)


def format_number(value: float, why: str = "not measured") -> str:
    """Three significant digits; "n/a (<why>)" for a value that is undefined (NaN), never "nan"."""
    return shown(value, ".3g", why)


def consequence_rows(metrics_by_notebook: dict[str, dict]) -> list[dict]:
    """One row per predicted consequence, notebooks in the given order (``{stem: metrics.json payload}``).

    Each row: ``notebook, consequence, task, measure, direction, effect, se, threshold, mde, seeds, larger,
    agrees, verdict`` (the kind: ``VERDICTS``) and ``verdict_text``; numbers as floats (NaN when not measured).
    """
    rows = []
    for notebook, payload in metrics_by_notebook.items():
        for record in predictions_of(payload):
            kind, text = verdict_of(record)
            rows.append({
                "notebook": notebook, "consequence": str(record.get("consequence", "")), "task": str(record.get("task", "")),
                "measure": str(record.get("measure", "")), "direction": str(record.get("direction", "")),
                "effect": statistics.recorded_number(record.get("effect")), "se": statistics.recorded_number(record.get("se")),
                "threshold": statistics.recorded_number(record.get("threshold")), "mde": statistics.recorded_number(record.get("mde")),
                "seeds": record.get("seeds"), "larger": record.get("larger") is True,
                "agrees": kind == "as predicted", "verdict": kind, "verdict_text": text,
            })
    return rows


def tally(rows: list[dict]) -> str:
    """"k of n predicted consequences larger than the noise, as predicted (m opposite, j null)"."""
    counts = {kind: sum(r["verdict"] == kind for r in rows) for kind in VERDICTS}
    return (f"{counts['as predicted']} of {len(rows)} predicted consequences larger than seed noise, as predicted "
            f"({counts['opposite']} opposite, {counts['null']} null)")


HEADER = ["notebook", "consequence", "task", "predicted (bug − fix)", "effect ± s.e.", "MDE", "seeds", "verdict"]


def cells(row: dict) -> list[str]:
    """The table's cells of one row, as text (``HEADER``'s order)."""
    return [row["notebook"], row["consequence"], row["task"], row["direction"],
            f"{format_number(row['effect'])} ± {format_number(row['se'], why_undefined('se', row))}",
            format_number(row["mde"], why_undefined("mde", row)),
            "—" if row["seeds"] is None else str(row["seeds"]), row["verdict_text"]]


def markdown_table(rows: list[dict]) -> str:
    """The rows as a GitHub-flavoured markdown table (``|`` in a cell escaped)."""
    def line(values):
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return "\n".join([line(HEADER), line(["---"] * len(HEADER)), *(line(cells(r)) for r in rows)])
