"""``grade(name, fn) -> Grade``: run an exercise's cases on a learner's function and say what it does wrong.

The learner's code runs in a fresh interpreter with a time limit per case (``workbench.exercises.sandbox``):
an infinite loop, an exception or a wrong return type is a 0 for that case with a message, never a crash of
the grader. The function travels as source text (``inspect.getsource`` of a notebook-defined function, or the
text of a cell or file), results come back as JSON. ``sandbox=False`` runs trusted code (the solutions, the
tests) in this process, much faster.

A ``Grade`` has ``passed`` (every case), ``score`` (fraction of cases passed: partial credit), ``cases`` (each
with what was tried, expected, got, and the mistake when the result matches a known wrong convention) and
``feedback`` (the text a learner reads). ``plot(ax)`` draws the figure of the first case that has one (e.g.
the weight of each response in the learner's loss against the expected ones).
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core.errors import InputError
from workbench.exercises import sandbox
from workbench.exercises.common import Case, lesson_link, run_case
from workbench.exercises.registry import EXERCISES, exercise

SOLUTIONS_DIR = Path(__file__).resolve().parent / "solutions"
DEFAULT_TIME_LIMIT_S = 10.0


@dataclass
class Grade:
    exercise: str
    cases: list[Case] = field(default_factory=list)
    error: str = ""  # the code could not be loaded at all (syntax error, no such function): every case is 0

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def score(self) -> float:
        return sum(c.score for c in self.cases) / len(self.cases) if self.cases else 0.0

    @property
    def mistakes(self) -> list[str]:
        """The named mistakes, each once, in case order."""
        seen: list[str] = []
        for c in self.cases:
            if c.mistake and not c.passed and c.mistake not in seen:
                seen.append(c.mistake)
        return seen

    @property
    def feedback(self) -> str:
        ex = EXERCISES.get(self.exercise)
        passed = sum(c.passed for c in self.cases)
        lines = [f"{self.exercise} · {ex.function if ex else '?'}: {passed}/{len(self.cases)} cases passed · score {self.score:.2f}"]
        if self.error:
            lines.append(f"could not load your code: {self.error}")
        for c in self.cases:
            if c.passed:
                lines.append(f"  ✓ {c.name}: {c.expected}")
                continue
            lines.append(f"  ✗ {c.name}: tried {c.tried}")
            lines.append(f"      expected {c.expected}")
            lines.append(f"      got      {c.got}")
            if c.mistake:
                lines.append("      → " + "\n        ".join(textwrap.wrap(c.mistake, 110)))
        if self.passed:
            lines.append("All cases pass." + (f" Compare with {lesson_link(ex.lesson)}." if ex else ""))
        elif ex:
            lines.append(f"The pitfall and its fix: {lesson_link(ex.lesson)}.")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.feedback

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "passed": self.passed, "score": self.score, "error": self.error,
                "mistakes": self.mistakes, "cases": [c.to_dict() for c in self.cases]}

    @classmethod
    def from_dict(cls, d: dict) -> Grade:
        return cls(str(d["exercise"]), [Case.from_dict(c) for c in d.get("cases", [])], str(d.get("error", "")))

    def plot(self, ax=None):
        """Draw the first case figure (failed cases first) on ``ax`` (a new small figure when None); None when no case has one."""
        from workbench.audit.result import AuditResult  # the audit's figure drawing, matplotlib on use

        cases = [c for c in self.cases if c.plot and not c.passed] + [c for c in self.cases if c.plot and c.passed]
        if not cases:
            return None
        case = cases[0]
        if ax is None:
            import matplotlib.pyplot as plt  # matplotlib: plotting only

            _, ax = plt.subplots(figsize=(5, 3.2), layout="constrained")
        AuditResult(f"{self.exercise} · {case.name}", case.passed, case.got, {"plot": case.plot}).plot(ax)
        return ax


def source_of(fn) -> str:
    """The source text of a function (works for functions defined in a notebook cell or a file)."""
    try:
        return textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    except (OSError, TypeError) as exc:
        raise InputError(
            f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({exc}): pass the code as text instead, "
            "e.g. grade(name, source=open('my_solution.py').read()) or the text of the cell that defines it"
        ) from None


def solution_source(name: str) -> str:
    """The reference solution's source (``workbench/exercises/solutions/<name>.py``)."""
    exercise(name)
    return (SOLUTIONS_DIR / f"{name}.py").read_text()


def grade(name: str, fn=None, *, source: str | None = None, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
          sandbox_run: bool = True) -> Grade:
    """Grade the learner's function for exercise ``name`` (see module doc).

    ``fn``: the function (its source is read with ``inspect``), or the source text itself; ``source``: the
    text of the cell or file that defines the function (when ``inspect`` cannot read it, or when it needs
    helpers defined beside it). ``sandbox_run=False``: call ``fn`` in this process (trusted code only; no time
    limit).
    """
    ex = exercise(name)
    if isinstance(fn, str) and source is None:
        fn, source = None, fn
    function = ex.function
    if callable(fn) and getattr(fn, "__name__", "<lambda>") != "<lambda>":
        function = fn.__name__
    if not sandbox_run:
        if not callable(fn):
            fn, error = sandbox.load_function(source or "", function)
            if fn is None:
                return Grade(name, [_not_loaded(ex, c, error) for c in ex.case_names], error)
        ex.prepare()
        return Grade(name, [run_case(ex, c, fn, source) for c in ex.case_names])
    if source is None:
        if fn is None:
            raise InputError(f"grade({name!r}): pass the function {ex.signature} or its source text")
        source = source_of(fn)
    cases, error = sandbox.run_cases(name, source, function, ex.case_names, time_limit_s=time_limit_s)
    return Grade(name, cases, error)


def _not_loaded(ex, case_name: str, error: str) -> Case:
    spec = ex.case(case_name)
    return Case(case_name, spec.tried, spec.expected, f"not run: {error}", False)


def grade_solutions(names: list[str] | None = None) -> list[Grade]:
    """Every reference solution graded in this process (the batch report's Exercises section; CI proves the graders)."""
    return [grade(n, solution_source(n), sandbox_run=False) for n in (names or list(EXERCISES))]
