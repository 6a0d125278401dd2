"""Graded exercises: the learner writes the fix, the workbench grades it and names the mistake.

One module per exercise (``s1_position_ids`` … ``p13_whiten``, named after the pitfall and numbered like the
lesson notebook it follows) holds its cases and the known wrong conventions it recognises; most cases reuse
the ``workbench.audit`` checks, which classify *which* convention a function implements. ``grade(name, fn)``
runs the cases in a sandboxed interpreter (``sandbox``) and returns a ``Grade``; ``submissions`` grades
executed-headless notebooks for ``python -m workbench grade``. The exercise notebooks are in
``notebooks/exercises/``; the reference solutions in ``workbench/exercises/solutions/`` (not in the folder
handed out); an exercise module's ``reference`` is its solution, imported from there (one home), except
``p6_logprobs``, whose reference is the float64 ground truth the bf16 case measures against.
"""

from workbench.exercises.grading import Grade, grade, grade_solutions, solution_source
from workbench.exercises.registry import EXERCISES, exercise

__all__ = ["EXERCISES", "Grade", "exercise", "grade", "grade_solutions", "solution_source"]
