"""Grading submitted notebooks: ``python -m workbench grade SUBMISSIONS… --out DIR``.

A submission is an exercise notebook, or a folder of them (one learner's work). Each notebook is executed
headless in the sandbox: its code cells, without IPython magics and without the grading cells (tagged
``grade``, which a learner may have changed), run in a fresh interpreter with a time limit, and the
exercise's cases run on the function they define. The exercise comes from the notebook's metadata
(``workbench.exercise``) or its file name. Written into ``DIR``: ``grades.csv`` (one row per submission and
exercise: score, points, cases passed, mistakes) and one feedback page ``<submission>.html`` per submission.
"""

from __future__ import annotations

import csv
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

from workbench.core.errors import InputError
from workbench.exercises.grading import DEFAULT_TIME_LIMIT_S, Grade, grade
from workbench.exercises.registry import EXERCISES
from workbench.exercises.sandbox import cell_mark

CSV_COLUMNS = ("submission", "notebook", "exercise", "score", "points", "max_points", "passed", "cases_passed", "cases", "mistakes")


@dataclass
class Graded:
    submission: str
    notebook: str
    grade: Grade
    points: float


SAVE_AS_JUPYTER = "submit the .ipynb file as Jupyter saved it (File → Save), not a copy edited by hand"


def read_notebook(path: Path) -> dict:
    """The notebook at ``path`` as JSON, checked to be one that ``code_of`` and ``points_of`` can read."""
    try:
        nb = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable notebook ({exc}); {SAVE_AS_JUPYTER}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise InputError(f"{path}: not a Jupyter notebook (no list of cells at the top level); {SAVE_AS_JUPYTER}")
    if not isinstance(nb.get("metadata", {}), dict):
        raise InputError(f"{path}: the notebook's metadata is not an object; {SAVE_AS_JUPYTER}")
    for i, cell in enumerate(nb["cells"]):
        source = cell.get("source", "") if isinstance(cell, dict) else None
        metadata = cell.get("metadata", {}) if isinstance(cell, dict) else None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("tags", []), list) \
                or not isinstance(metadata.get("nbgrader") or {}, dict) or not (
                isinstance(source, str) or (isinstance(source, list) and all(isinstance(s, str) for s in source))):
            raise InputError(f"{path}: cell {i + 1} is not a notebook cell (an object with a text source); {SAVE_AS_JUPYTER}")
    workbench = nb.get("metadata", {}).get("workbench") or {}
    if not isinstance(workbench, dict):
        raise InputError(f"{path}: metadata workbench is {workbench!r}, not an object; restore it from the notebook handed "
                         "out, or remove it (the exercise is then told by the file name)")
    points = workbench.get("points", 1)
    if isinstance(points, bool) or not isinstance(points, (int, float)) or not points > 0:
        raise InputError(f"{path}: metadata workbench.points is {points!r}, not a positive number of points; set it to "
                         "the exercise's points (1 in the notebooks handed out) or remove it")
    return nb


def exercise_of(nb: dict, path: Path) -> str:
    """The exercise a notebook answers: its metadata, else an exercise name in its file name."""
    name = (nb.get("metadata", {}).get("workbench") or {}).get("exercise")
    if isinstance(name, str) and name in EXERCISES:
        return name
    found = [n for n in EXERCISES if n in path.stem]
    if len(found) == 1:
        return found[0]
    raise InputError(f"{path}: cannot tell which exercise this notebook answers (no metadata workbench.exercise and no "
                     f"exercise name in the file name); name the file after its exercise (e.g. 05_s5_grpo_loss.ipynb) or set "
                     f"metadata workbench.exercise to one of: {', '.join(EXERCISES)}")


def _text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def code_of(nb: dict) -> str:
    """The code a headless run executes: every code cell except the grading ones, each after its ``cell_mark`` (the
    sandbox runs them one by one; one that raises does not stop the others, as in nbgrader)."""
    keep = [(i, c) for i, c in enumerate(nb["cells"], 1) if c.get("cell_type") == "code"
            and "grade" not in (c.get("metadata", {}).get("tags") or [])
            and not (c.get("metadata", {}).get("nbgrader") or {}).get("grade")]
    return "\n\n".join(f"{cell_mark(i)}\n{_text(c)}" for i, c in keep)


def points_of(nb: dict) -> float:
    return float((nb.get("metadata", {}).get("workbench") or {}).get("points", 1))


def notebooks_of(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.glob("*.ipynb") if not p.name.startswith("."))
        if not found:
            raise InputError(f"{path}: a folder without notebooks (*.ipynb); pass exercise notebooks (.ipynb) or folders "
                             "that hold them")
        return found
    if path.is_file() and path.suffix == ".ipynb":
        return [path]
    if not path.exists():
        raise InputError(f"{path}: no such file or folder; check the path (relative paths start at {Path.cwd()})")
    raise InputError(f"{path}: not a notebook (.ipynb) or a folder; pass the learner's exercise notebook (.ipynb) or a "
                     "folder of them")


def submission_name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem if path.is_file() else path.name) or "submission"


def plan(paths: list[Path]) -> list[tuple[str, Path, dict, str]]:
    """(submission, notebook, parsed notebook, exercise) for every notebook; ``InputError`` before anything runs."""
    jobs, names = [], set()
    for path in paths:
        name = submission_name(path)
        if name in names:
            raise InputError(f"{path}: two submissions named {name!r}; rename one (the name is the feedback page's)")
        names.add(name)
        for notebook in notebooks_of(path):
            nb = read_notebook(notebook)
            jobs.append((name, notebook, nb, exercise_of(nb, notebook)))
    return jobs


def grade_submissions(paths: list[Path], out: Path, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, log=print) -> list[Graded]:
    """Grade every notebook of ``paths``; write ``grades.csv`` and one feedback page per submission into ``out``."""
    jobs = plan([Path(p) for p in paths])
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: a file, not a folder; name a folder for grades.csv and the feedback pages")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create the folder ({exc.strerror}); name a folder you can write to") from None
    graded = []
    for submission, notebook, nb, name in jobs:
        result = grade(name, source=code_of(nb), time_limit_s=time_limit_s)
        points = points_of(nb)
        graded.append(Graded(submission, notebook.name, result, points))
        log(f"{submission}  {name:<18} {result.score * points:.2f}/{points:g}")
    write_csv(out / "grades.csv", graded)
    for submission in dict.fromkeys(g.submission for g in graded):
        write_feedback(out / f"{submission}.html", submission, [g for g in graded if g.submission == submission])
    return graded


def write_csv(path: Path, graded: list[Graded]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for item in graded:
            result = item.grade
            writer.writerow([item.submission, item.notebook, result.exercise, f"{result.score:.4f}",
                             f"{result.score * item.points:.4f}", f"{item.points:g}", result.passed,
                             sum(c.passed for c in result.cases), len(result.cases), " | ".join(result.mistakes)])


def _figure(result: Grade) -> str:
    if not any(c.plot for c in result.cases):
        return ""
    import base64
    import io

    import matplotlib  # matplotlib: the feedback page's figure only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = result.plot()
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")  # the legend below the axes and long labels whole
    plt.close(ax.figure)
    return f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def write_feedback(path: Path, submission: str, graded: list[Graded]) -> None:
    total = sum(g.grade.score * g.points for g in graded)
    possible = sum(g.points for g in graded)
    sections = []
    for item in graded:
        result = item.grade
        rows = "".join(
            f"<tr class='{'ok' if c.passed else 'bad'}'><td>{'✓' if c.passed else '✗'} {html.escape(c.name)}</td>"
            f"<td>{html.escape(c.tried)}</td><td>{html.escape(c.expected)}</td><td>{html.escape(c.got)}</td>"
            f"<td>{html.escape(c.mistake)}</td></tr>" for c in result.cases)
        sections.append(f"<h2>{html.escape(result.exercise)} · {result.score * item.points:.2f}/{item.points:g} "
                        f"<small>({html.escape(item.notebook)})</small></h2>"
                        f"<pre>{html.escape(result.feedback)}</pre>{_figure(result)}"
                        "<details><summary>cases</summary><table><tr><th>case</th><th>tried</th><th>expected</th><th>got</th>"
                        f"<th>mistake</th></tr>{rows}</table></details>")
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Feedback · {html.escape(submission)}</title>"
            "<style>body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
            "pre{background:#f6f8fa;padding:.6em;white-space:pre-wrap}table{border-collapse:collapse;font-size:.85em}"
            "td,th{border:1px solid #ddd;padding:.2em .4em;text-align:left}.bad td:first-child{color:#D55E00}"
            ".ok td:first-child{color:#0072B2}img{max-width:100%}</style></head><body>"
            f"<h1>Feedback · {html.escape(submission)}</h1><p>total <b>{total:.2f}/{possible:g}</b> points</p>"
            f"{''.join(sections)}</body></html>")
    path.write_text(page)
