"""notebook_api: the closing line, where an interactive notebook writes, how it prints paths, figures.json."""

import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from workbench.catalogue import notebook_api  # noqa: E402

PREDICTED = {"consequence": "c", "direction": "+", "effect": 0.3, "se": 0.05, "threshold": 4.303, "mde": 0.215,
             "larger": True, "seeds": 3, "task": "sums", "measure": "m", "agrees": True}


def payload(prediction=None, reproduced=True, fixed=True):
    metrics = {} if prediction is None else {"prediction": prediction}
    return {"notebook": "05_x", "reproduced": reproduced, "fixed": fixed, "metrics": metrics}


def test_the_closing_line_keeps_the_mechanism_apart_from_the_consequence():
    assert notebook_api.closing_line(payload(PREDICTED), "metrics.json") == (
        "05_x: mechanism reproduced: yes, fixed: yes; consequence in training: shown, as predicted → metrics.json")
    null = {**PREDICTED, "larger": False, "effect": 0.1}
    assert "consequence in training: not shown: no effect > 0.215 →" in notebook_api.closing_line(payload(null), "m")
    assert "opposite" in notebook_api.closing_line(payload({**PREDICTED, "effect": -0.3}), "m")
    line = notebook_api.closing_line(payload(reproduced=True, fixed=False), "m")
    assert "mechanism reproduced: yes, fixed: no; consequence in training: not measured here" in line


def test_an_interactive_notebook_writes_under_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    folder = notebook_api.prepare("05_x", "", interactive=False)
    assert folder == tmp_path / "runs" / "interactive" / "05_x" and folder.is_dir()
    monkeypatch.chdir(tmp_path)
    assert notebook_api.working_folder() == tmp_path
    assert notebook_api.shown_path(tmp_path / "runs" / "m.json") == os.path.join("runs", "m.json")


def test_save_figure_records_what_legibility_found(tmp_path):
    fig, ax = plt.subplots(figsize=(20, 3))
    ax.plot([0, 1], [0, 1])
    notebook_api.save_figure(fig, tmp_path, "wide")
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1], [0, 1])
    notebook_api.save_figure(fig, tmp_path, "narrow")
    checks = json.loads((tmp_path / "figures.json").read_text())
    assert checks["wide"]["problems"] and checks["narrow"]["problems"] == []
    assert (tmp_path / "wide.png").is_file()
