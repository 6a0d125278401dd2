"""What every exercise module is made of: an ``Exercise`` (name, the learner's function and signature, the
lesson it follows, its cases), a ``CaseSpec`` per case, and the ``Case`` a case returns.

An exercise module takes its ``Exercise`` from the course's table (``EXERCISE = COURSE[name]``, ``course``) and
declares each case where its code is, ``@EXERCISE.add_case(name, tried, expected)`` above ``run(fn) -> Outcome`` (or
``EXERCISE.add_case(name, tried, expected, run)`` for a case built by a factory); cases run in declaration order.

A case calls the learner's function on crafted inputs and says what was tried, what was expected, what came
back, and — when the result matches a known wrong convention — the mistake by name. ``run_case`` turns
whatever the learner's code does (raises, returns a list, returns the wrong shape) into a failed case with a
clear message: a case never crashes the grader. Cases run in the sandbox's child interpreter
(``workbench.exercises.sandbox``) or, for trusted code (the solutions, the tests), in the calling process.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from workbench.core.errors import AuditSignatureError

SUBMISSION_FILENAME = "<submission>"  # the file name the learner's source is compiled under (tracebacks point into it)


@dataclass
class Case:
    """One graded case: what was tried, what was expected, what the learner's function gave."""

    name: str
    tried: str
    expected: str
    got: str
    passed: bool
    mistake: str = ""
    plot: dict | None = None

    @property
    def score(self) -> float:
        return 1.0 if self.passed else 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        return cls(name=str(d["name"]), tried=str(d["tried"]), expected=str(d["expected"]), got=str(d["got"]),
                   passed=bool(d["passed"]), mistake=str(d.get("mistake") or ""), plot=d.get("plot"))


class CaseFailure(Exception):
    """Raised inside a case when the learner's output is unusable (wrong type, shape, NaN): ``got`` says what came back."""

    def __init__(self, got: str, mistake: str = ""):
        super().__init__(got)
        self.got, self.mistake = got, mistake


@dataclass
class Outcome:
    """What a case's ``run`` returns."""

    got: str
    passed: bool
    mistake: str = ""
    plot: dict | None = None


@dataclass
class CaseSpec:
    name: str
    tried: str
    expected: str
    run: Callable  # run(fn) -> Outcome


@dataclass
class Exercise:
    name: str
    signature: str  # the function the learner writes, e.g. "k3(logp: Tensor[B, T], ref_logp: Tensor[B, T]) -> Tensor[B, T]"
    lesson: str  # the lesson notebook's stem, e.g. "05_grpo_loss_normalization"
    summary: str
    cases: list[CaseSpec] = field(default_factory=list)
    needs_model: bool = False

    @property
    def function(self) -> str:
        """The name of the function the learner writes (the signature's)."""
        return self.signature.split("(", 1)[0]

    @property
    def case_names(self) -> list[str]:
        return [c.name for c in self.cases]

    def add_case(self, name: str, tried: str, expected: str, run: Callable | None = None):
        """Declare the next case (cases run and are shown in the order declared): ``run(fn) -> Outcome``.

        Without ``run``, a decorator: the case's name, what it tries and what it expects sit above its code.
        """
        if run is None:
            return lambda function: self.add_case(name, tried, expected, function)
        if name in self.case_names:
            raise ValueError(f"exercise {self.name} declares case {name!r} twice")
        self.cases.append(CaseSpec(name, tried, expected, run))
        return run

    def case(self, name: str) -> CaseSpec:
        for spec in self.cases:
            if spec.name == name:
                return spec
        raise KeyError(f"exercise {self.name} has no case {name!r}; cases: {self.case_names}")

    def prepare(self) -> None:
        """Build what the cases share (the tiny model) before the first case is timed."""
        if self.needs_model:
            tiny_gpt2()


@functools.lru_cache(maxsize=1)
def tiny_gpt2():
    """The random tiny GPT-2 (learned absolute positions) and the character tokenizer, built once per process."""
    from workbench.modeling.tiny import tiny_model  # transformers: on use (seconds), only the model exercises need it

    model, tokenizer = tiny_model("gpt2", seed=0)
    return model.eval(), tokenizer


def your_line(exc: BaseException, source: str | None) -> str:
    """``line N: <code>`` of the innermost frame of the learner's code in ``exc``'s traceback, or ''."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SUBMISSION_FILENAME]
    if not frames:
        return ""
    frame = frames[-1]
    text = frame.line or ""
    if not text and source:
        lines = source.splitlines()
        text = lines[frame.lineno - 1].strip() if 0 < frame.lineno <= len(lines) else ""
    return f" (your line {frame.lineno}: {text})" if text else f" (your line {frame.lineno})"


def run_case(exercise: Exercise, name: str, fn, source: str | None = None) -> Case:
    """Run case ``name`` of ``exercise`` on ``fn``; every failure of the learner's code becomes a failed case."""
    spec = exercise.case(name)

    def failed(got: str, mistake: str = "") -> Case:
        return Case(name, spec.tried, spec.expected, got, False, mistake)

    try:
        with torch.no_grad():
            outcome = spec.run(fn)
    except CaseFailure as exc:
        return failed(exc.got, exc.mistake)
    except NotImplementedError:
        return failed("NotImplementedError: the function is still the stub; write its body")
    except AuditSignatureError as exc:
        return failed(f"wrong signature or return value: {exc}", f"write exactly {exercise.signature}")
    except RecursionError as exc:
        return failed(f"RecursionError: {exc}{your_line(exc, source)}")
    except Exception as exc:  # the learner's code raised: a 0 for this case, never a crash of the grader
        return failed(f"your function raised {type(exc).__name__}: {exc}{your_line(exc, source)}")
    except SystemExit as exc:
        return failed(f"your function called exit({exc.code}): return a value instead")
    return Case(name, spec.tried, spec.expected, outcome.got, bool(outcome.passed), outcome.mistake, outcome.plot)


def tensor_out(value, what: str, shape: tuple | None = None, *, floating: bool | None = None) -> torch.Tensor:
    """The learner's return value checked to be a tensor (of ``shape``; floating point or integer when asked)."""
    if not isinstance(value, torch.Tensor):
        raise CaseFailure(f"returned {type(value).__name__}, expected {what}", f"return a torch.Tensor: {what}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CaseFailure(f"returned a tensor of shape {tuple(value.shape)}, expected {tuple(shape)} ({what})")
    if floating is True and not value.is_floating_point():
        raise CaseFailure(f"returned dtype {value.dtype}, expected a floating point tensor ({what})")
    if floating is False and (value.is_floating_point() or value.is_complex()):
        raise CaseFailure(f"returned dtype {value.dtype}, expected an integer tensor ({what})",
                          "positions index an embedding table: return a LongTensor (e.g. .long())")
    return value


def short(t: torch.Tensor, digits: int = 3) -> str:
    """A tensor as a short readable list."""
    t = t.detach().cpu()
    if t.is_floating_point():
        return str([[round(float(v), digits) for v in row] for row in t.reshape(-1, t.shape[-1]).double()]) if t.dim() > 1 \
            else str([round(float(v), digits) for v in t.double().reshape(-1)])
    return str(t.tolist())


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return a.shape == b.shape and bool(torch.isfinite(a).all()) and torch.allclose(a, b, atol=atol, rtol=rtol)


def diagnose(value, mistakes: dict, args: tuple, same=close) -> str:
    """The message of the first known wrong implementation whose output on ``args`` equals ``value``, or ''.

    ``mistakes``: ``{key: (message, wrong_fn)}`` — the conventions a learner plausibly implements.
    """
    for message, wrong in mistakes.values():
        try:
            expected = wrong(*args)
        except Exception:  # a wrong implementation that cannot run on these inputs matches nothing
            continue
        try:
            if same(value, expected):
                return message
        except Exception:
            continue
    return ""


def lesson_link(lesson: str) -> str:
    return f"lesson {lesson[:2]} (notebooks/{lesson}.ipynb)"
