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

import ast
import inspect
import sys
import textwrap
import types
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
    notes: list[str] = field(default_factory=list)  # cells of a notebook that raised while loading (the others ran)

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
        for case in self.cases:
            if case.mistake and not case.passed and case.mistake not in seen:
                seen.append(case.mistake)
        return seen

    @property
    def feedback(self) -> str:
        ex = EXERCISES.get(self.exercise)
        passed = sum(c.passed for c in self.cases)
        lines = [f"{self.exercise} · {ex.function if ex else '?'}: {passed}/{len(self.cases)} cases passed · score {self.score:.2f}"]
        if self.error:
            lines.append(f"could not load your code: {self.error}")
        elif self.notes:
            lines.extend(f"note: {note} — the cells after it ran all the same" for note in self.notes)
        for case in self.cases:
            if case.passed:
                lines.append(f"  ✓ {case.name}: {case.expected}")
                continue
            lines.append(f"  ✗ {case.name}: tried {case.tried}")
            lines.append(f"      expected {case.expected}")
            lines.append(f"      got      {case.got}")
            if case.mistake:
                lines.append("      → " + "\n        ".join(textwrap.wrap(case.mistake, 110)))
        if self.passed:
            lines.append("All cases pass." + (f" Compare with {lesson_link(ex.lesson)}." if ex else ""))
        elif ex:
            lines.append(f"The pitfall and its fix: {lesson_link(ex.lesson)}.")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.feedback

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "passed": self.passed, "score": self.score, "error": self.error,
                "notes": list(self.notes), "mistakes": self.mistakes, "cases": [c.to_dict() for c in self.cases]}

    @classmethod
    def from_dict(cls, d: dict) -> Grade:
        return cls(str(d["exercise"]), [Case.from_dict(c) for c in d.get("cases", [])], str(d.get("error", "")),
                   [str(n) for n in d.get("notes", [])])

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
    """The source text of a function and of what it uses from its notebook or module (see ``_used_globals``).

    The sandbox runs this text alone, so a helper function, an ``import numpy as np`` or a constant defined beside
    the learner's function (in its cell, or another cell of the notebook) travels with it.
    """
    fn = inspect.unwrap(fn)
    try:
        main = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise InputError(
            f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({exc}): pass the code as text instead, "
            "e.g. grade(name, source=open('my_solution.py').read()) or the text of the cell that defines it"
        ) from None
    bindings, helpers = _used_globals(fn)
    return "\n".join(bindings) + ("\n\n\n" if bindings else "") + "".join(h + "\n\n" for h in helpers) + main


def _names_in(code: types.CodeType) -> set[str]:
    """The global (and attribute) names a code object and the code objects nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_in(const)
    return names


def _literal(value) -> str | None:
    """``repr(value)`` when it reads back as the same plain constant (numbers, strings, tuples of them …), else None."""
    if not isinstance(value, (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset, type(None))):
        return None
    text = repr(value)
    try:
        return text if len(text) <= 10_000 and ast.literal_eval(text) == value else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _importable(value) -> tuple[str, str] | None:
    """(module, attribute) from which ``value`` imports as itself (``torch.expm1``: torch, expm1), or None."""
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        return None
    parts = module.split(".")
    for attribute in dict.fromkeys((getattr(value, "__qualname__", None), getattr(value, "__name__", None))):
        if not isinstance(attribute, str) or not attribute.isidentifier():
            continue
        for end in range(len(parts), 0, -1):  # the defining module, then its parents (torch.expm1 says module torch)
            candidate = ".".join(parts[:end])
            if getattr(sys.modules.get(candidate), attribute, None) is value:
                return candidate, attribute
    return None


def _optional(statement: str) -> str:
    """An import that may fail in the sandbox (a module beside the notebook): then the name is undefined, and says so."""
    return f"try:\n    {statement}\nexcept ImportError:\n    pass"


def _used_globals(fn) -> tuple[list[str], list[str]]:
    """What ``fn`` uses from its globals, as code: (import and constant lines, the sources of helper functions and
    classes defined beside it, each with what it uses in turn). Anything else (a tensor, an object) is left out: the
    sandbox then says which name is not defined."""
    bindings: list[str] = []
    helpers: list[str] = []
    done = {fn.__name__}
    todo = [fn]
    while todo:
        current = todo.pop(0)
        namespace = getattr(current, "__globals__", {})
        for name in sorted(_names_in(current.__code__)):
            if name in done or name not in namespace:
                continue
            done.add(name)
            value = namespace[name]
            if isinstance(value, types.ModuleType):
                module = value.__name__
                bindings.append(_optional(f"import {module}" if module == name else f"import {module} as {name}"))
            elif (isinstance(value, types.FunctionType) or inspect.isclass(value)) and value.__module__ == fn.__module__:
                try:
                    helpers.append(textwrap.dedent(inspect.getsource(value)).rstrip())
                except (OSError, TypeError):
                    continue
                if isinstance(value, types.FunctionType):
                    todo.append(value)
            elif callable(value) and (where := _importable(value)):
                module, attribute = where
                bindings.append(_optional(f"from {module} import {attribute}" + (f" as {name}" if attribute != name else "")))
            elif (text := _literal(value)) is not None:
                bindings.append(f"{name} = {text}")
    return bindings, helpers


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
        notes = []
        if not callable(fn):
            fn, error, notes = sandbox.load_function(source or "", function)
            if fn is None:
                return Grade(name, [_not_loaded(ex, c, error) for c in ex.case_names], error)
        ex.prepare()
        return Grade(name, [run_case(ex, c, fn, source) for c in ex.case_names], notes=notes)
    if source is None:
        if fn is None:
            raise InputError(f"grade({name!r}): pass the function {ex.signature} or its source text")
        source = source_of(fn)
    cases, error, notes = sandbox.run_cases(name, source, function, ex.case_names, time_limit_s=time_limit_s)
    return Grade(name, cases, error, notes)


def _not_loaded(ex, case_name: str, error: str) -> Case:
    spec = ex.case(case_name)
    return Case(case_name, spec.tried, spec.expected, f"not run: {error}", False)


def grade_solutions(names: list[str] | None = None) -> list[Grade]:
    """Every reference solution graded in this process (the batch report's Exercises section; CI proves the graders)."""
    return [grade(n, solution_source(n), sandbox_run=False) for n in (names or list(EXERCISES))]
