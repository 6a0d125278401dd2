"""python -m workbench grade: two submissions graded into grades.csv and two feedback pages; bad input exits 2."""

import csv
import json
from pathlib import Path

from workbench.cli.main import main
from workbench.exercises import solution_source

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks" / "exercises"
TOKEN_MEAN = "import torch\n\ndef grpo_loss(per_token_loss, mask):\n    return (per_token_loss * mask).sum() / mask.sum()\n"


def answered(source: str, to: Path, stem: str = "05_s5_grpo_loss") -> Path:
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    nb["cells"][2]["source"] = source
    nb["cells"][4]["source"] = "raise RuntimeError('a tampered grading cell is not run by the grader')"
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_text(json.dumps(nb))
    return to


def test_grade_two_submissions(tmp_path, capsys):
    alice = answered("%matplotlib inline\n" + solution_source("s5_grpo_loss"), tmp_path / "alice.ipynb")
    bob = answered(TOKEN_MEAN, tmp_path / "bob" / "05_s5_grpo_loss.ipynb").parent
    out = tmp_path / "grades"
    assert main(["grade", str(alice), str(bob), "--out", str(out)]) == 0
    rows = {r["submission"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert set(rows) == {"alice", "bob"}
    assert float(rows["alice"]["score"]) == 1.0 and rows["alice"]["passed"] == "True"
    assert float(rows["bob"]["score"]) < 1.0 and "token-mean" in rows["bob"]["mistakes"]
    page = (out / "bob.html").read_text()
    assert "token-mean" in page and "data:image/png;base64," in page
    assert (out / "alice.html").is_file()


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["grade", str(tmp_path / "missing.ipynb"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "notes.ipynb").write_text("not json")
    assert main(["grade", str(tmp_path / "notes.ipynb"), "--out", str(tmp_path / "o")]) == 2
    assert "not a readable notebook" in capsys.readouterr().err
    other = tmp_path / "other.ipynb"
    other.write_text(json.dumps({"cells": [], "metadata": {}}))
    assert main(["grade", str(other), "--out", str(tmp_path / "o")]) == 2
    assert "cannot tell which exercise" in capsys.readouterr().err
