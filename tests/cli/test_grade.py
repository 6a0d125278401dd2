"""python -m workbench grade: two submissions graded into grades.csv and two feedback pages; bad input exits 2."""

import csv
import json
from pathlib import Path

import pytest

from workbench.cli.main import main
from workbench.exercises import solution_source

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks" / "exercises"
TOKEN_MEAN = "import torch\n\ndef grpo_loss(per_token_loss, mask):\n    return (per_token_loss * mask).sum() / mask.sum()\n"


def answered(source: str, to: Path, stem: str = "05_s5_grpo_loss", scratch: str = "") -> Path:
    nb = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())
    nb["cells"][2]["source"] = source
    nb["cells"][4]["source"] = "raise RuntimeError('a tampered grading cell is not run by the grader')"
    if scratch:  # a learner's own cell after the stub
        nb["cells"].insert(3, {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": scratch})
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_text(json.dumps(nb))
    return to


def test_grade_two_submissions(tmp_path, capsys):
    alice = answered("%matplotlib inline\n" + solution_source("s5_grpo_loss"), tmp_path / "alice.ipynb",
                     scratch="grpo_loss(torch.ones(2, 3), my_mask)  # a scratch cell that raises: the cells run on")
    bob = answered(TOKEN_MEAN, tmp_path / "bob" / "05_s5_grpo_loss.ipynb").parent
    out = tmp_path / "grades"
    assert main(["grade", str(alice), str(bob), "--out", str(out)]) == 0
    rows = {r["submission"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert set(rows) == {"alice", "bob"}
    assert float(rows["alice"]["score"]) == 1.0 and rows["alice"]["passed"] == "True"
    assert float(rows["bob"]["score"]) < 1.0 and "token-mean" in rows["bob"]["mistakes"]
    page = (out / "bob.html").read_text()
    assert "token-mean" in page and "data:image/png;base64," in page
    assert "note: cell 4 raised NameError: name &#x27;my_mask&#x27; is not defined" in (out / "alice.html").read_text()


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


def _stub(**changes) -> str:
    nb = json.loads((NOTEBOOKS / "09_p9_k3.ipynb").read_text())
    for key, value in changes.items():
        if key == "cell":
            nb["cells"][2] = value
        else:
            nb["metadata"][key] = value
    return json.dumps(nb)


BAD = {
    # case → (the file's name and text, words the message must hold: the problem and its fix)
    "missing": (None, ("missing.ipynb: no such file or folder", "check the path")),
    "not json": (("a.ipynb", "not json"), ("not a readable notebook", "as Jupyter saved it")),
    "not utf-8": (("a.ipynb", "\udcff"), ("not a readable notebook", "as Jupyter saved it")),
    "a list": (("a.ipynb", "[1, 2]"), ("not a Jupyter notebook", "as Jupyter saved it")),
    "a python file": (("a.py", "print(1)"), ("a.py: not a notebook (.ipynb) or a folder", "pass the learner's exercise notebook")),
    "a cell that is text": (("09_p9_k3.ipynb", _stub(cell="def k3(a, b): return a")),
                            ("cell 3 is not a notebook cell", "as Jupyter saved it")),
    "a source that is a number": (("09_p9_k3.ipynb", _stub(cell={"cell_type": "code", "source": 3, "metadata": {}})),
                                  ("cell 3 is not a notebook cell",)),
    "metadata not an object": (("09_p9_k3.ipynb", _stub(workbench="p9_k3")), ("metadata workbench is 'p9_k3', not an object", "remove it")),
    "points not a number": (("09_p9_k3.ipynb", _stub(workbench={"exercise": "p9_k3", "points": "many"})),
                            ("workbench.points is 'many', not a positive number", "set it to")),
    "negative points": (("09_p9_k3.ipynb", _stub(workbench={"exercise": "p9_k3", "points": -1})), ("workbench.points is -1",)),
    "unknown exercise": (("notes.ipynb", json.dumps({"cells": [], "metadata": {"workbench": {"exercise": ["p9_k3"]}}})),
                         ("cannot tell which exercise", "name the file after its exercise", "p13_whiten")),
    "empty folder": (("empty/", ""), ("a folder without notebooks", "folders that hold them")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_submission_names_the_problem_and_the_fix_and_exits_2(tmp_path, capsys, case):
    written, words = BAD[case]
    if written is None:
        path = tmp_path / "missing.ipynb"
    elif written[0].endswith("/"):
        path = tmp_path / written[0]
        path.mkdir()
    else:
        path = tmp_path / written[0]
        path.write_bytes(written[1].encode("utf-8", "surrogateescape"))
    out = tmp_path / "out"
    assert main(["grade", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    for word in words:
        assert word in err, err
    assert not out.exists()  # bad input is caught before anything is graded or written


def test_out_that_is_a_file_exits_2_before_grading(tmp_path, capsys):
    (tmp_path / "09_p9_k3.ipynb").write_text(_stub())
    (tmp_path / "grades").write_text("a file")
    assert main(["grade", str(tmp_path / "09_p9_k3.ipynb"), "--out", str(tmp_path / "grades")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "a file, not a folder" in err and "name a folder" in err
