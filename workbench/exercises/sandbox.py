"""Run a learner's function in a fresh interpreter, with a time limit per case, and read the results as JSON.

Parent (``run_cases``): starts ``python -m workbench.exercises.sandbox``, writes one JSON request on its stdin
(exercise, source text, function name, case names), then reads one JSON line per case from its stdout. A case
that does not answer within ``time_limit_s`` (an infinite loop) or kills the interpreter is a 0 with a message;
the child is killed and a fresh one runs the remaining cases. Nothing from the learner's side is ever
unpickled: only JSON crosses the boundary. Model building and loading the code get their own, longer limit
(``load_limit_s``), so the per-case limit measures the learner's code only.

Child (``main``): keeps the real stdout for the protocol and points fd 1 at stderr (a ``print`` in the
learner's code cannot corrupt it), builds what the cases share, compiles the source under the file name
``<submission>`` (tracebacks point at the learner's lines), and runs each case.
"""

from __future__ import annotations

import json
import linecache
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from workbench.exercises.common import SUBMISSION_FILENAME, Case

LOAD_LIMIT_S = 180.0  # importing torch + transformers and building the tiny model on a busy 2-core machine
PRELUDE = "import math\nimport torch\nimport torch.nn.functional as F\n"  # what a notebook cell usually has imported


def strip_magics(source: str) -> str:
    """The source without IPython magics and shell escapes (``%matplotlib``, ``!pip``), which plain Python cannot run."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


CELL_MARK = re.compile(r"^#%% workbench cell (\d+)$")  # a line ``code_of`` puts before each notebook cell it keeps


def cell_mark(number: int) -> str:
    """The line that starts notebook cell ``number`` (1-based) in a submission's text: its cells load one by one."""
    return f"#%% workbench cell {number}"


def _chunks(text: str) -> list[tuple[str, int, str]]:
    """(label, first line index, code) of each notebook cell in ``text``; one chunk, 'your code', without cell marks."""
    chunks: list[tuple[str, int, list[str]]] = [("your code", 0, [])]
    for i, line in enumerate(text.splitlines()):
        found = CELL_MARK.match(line)
        if found:
            chunks.append((f"cell {found.group(1)}", i, []))
        chunks[-1][2].append(line)
    return [(label, first, "\n".join(lines)) for label, first, lines in chunks if any(s.strip() for s in lines)]


def _where(exc: BaseException) -> str:
    frames, line = exc.__traceback__, ""
    while frames is not None:
        if frames.tb_frame.f_code.co_filename == SUBMISSION_FILENAME:
            line = f" (line {frames.tb_lineno})"
        frames = frames.tb_next
    return line


def load_function(source: str, function: str) -> tuple:
    """Execute ``source`` in a fresh namespace: (the function called ``function``, '', notes) or (None, why not, notes).

    A notebook's text (cells marked by ``cell_mark``) runs cell by cell, and a cell that raises does not stop the
    cells after it, as nbgrader executes notebooks (errors allowed): a scratch cell that fails costs nothing if the
    function is defined. Each failed cell is a note; without the function, the notes say why.
    """
    text = strip_magics(source)
    linecache.cache[SUBMISSION_FILENAME] = (len(text), None, [line + "\n" for line in text.splitlines()], SUBMISSION_FILENAME)
    namespace: dict = {"__name__": "__submission__"}
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    chunks = _chunks(text)
    notes = []
    for label, first, code in chunks:
        try:
            # leading newlines: line numbers (tracebacks, ``your_line``) count in the whole text, as ``linecache`` holds it
            exec(compile("\n" * first + code, SUBMISSION_FILENAME, "exec"), namespace)
        except SyntaxError as exc:
            notes.append(f"{label + ': ' if len(chunks) > 1 else ''}SyntaxError on line {exc.lineno}: {exc.msg}")
        except BaseException as exc:  # top-level code of the submission raised (NameError, an assert, exit())
            notes.append(f"{'running ' + label if len(chunks) == 1 else label} raised {type(exc).__name__}: {exc}{_where(exc)}")
    fn = namespace.get(function)
    if not callable(fn):
        if len(chunks) == 1 and notes:
            return None, notes[0], []
        why = f"your code defines no function named `{function}`"
        return None, why + (f" ({'; '.join(notes)})" if notes else ""), notes
    return fn, "", notes


def _child_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the workbench this process runs, first on the child's path
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _tail(path: Path, chars: int = 400) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-chars:]


def _failed(exercise, name: str, got: str) -> Case:
    spec = exercise.case(name)
    return Case(name, spec.tried, spec.expected, got, False)


def run_cases(name: str, source: str, function: str, case_names: list[str], *, time_limit_s: float = 10.0,
              load_limit_s: float = LOAD_LIMIT_S) -> tuple[list[Case], str, list[str]]:
    """Run the cases of exercise ``name`` on ``function`` from ``source`` in child interpreters; (cases, load error, the
    notes of ``load_function``: the cells that raised)."""
    from workbench.exercises.registry import exercise  # the registry imports the exercise modules, which import this one

    ex = exercise(name)
    results: dict[str, Case] = {}
    remaining = list(case_names)
    load_error, notes = "", []
    with tempfile.TemporaryDirectory(prefix="workbench-sandbox-") as tmp:
        while remaining:
            log = Path(tmp) / f"stderr-{len(results)}.txt"
            with open(log, "w") as err:
                proc = subprocess.Popen([sys.executable, "-m", "workbench.exercises.sandbox"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=err, env=_child_env(), text=True, cwd=tmp)
            lines: queue.Queue = queue.Queue()
            threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
            try:
                proc.stdin.write(json.dumps({"exercise": name, "source": source, "function": function, "cases": remaining}))
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                first = lines.get(timeout=load_limit_s)
            except queue.Empty:
                first = None
                load_error = f"loading your code took longer than {load_limit_s:.0f} s (a loop at the top level of the cell?)"
            hello = json.loads(first) if first else {}
            notes = notes or hello.get("notes") or []
            if not hello.get("ready"):
                load_error = hello.get("load_error") or load_error or \
                    f"the grader's interpreter exited while loading: {_tail(log) or 'no message'}"
                _stop(proc)
                for case in remaining:
                    results[case] = _failed(ex, case, f"not run: {load_error}")
                break
            done = 0
            for case in remaining:
                try:
                    line = lines.get(timeout=time_limit_s)
                except queue.Empty:
                    results[case] = _failed(ex, case, f"time limit: no answer within {time_limit_s:g} s (an infinite loop? "
                                                      "a loop whose condition never changes?)")
                    done += 1
                    break
                if line is None:
                    proc.wait()
                    results[case] = _failed(ex, case, f"the interpreter running your code died (exit code {proc.returncode}"
                                                      f"{': ' + _tail(log, 200) if _tail(log, 200) else ''})")
                    done += 1
                    break
                results[case] = Case.from_dict(json.loads(line))
                done += 1
            _stop(proc)
            remaining = remaining[done:]
    return [results[c] for c in case_names], load_error, notes


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout:
        proc.stdout.close()


def main() -> None:
    """The child: read the request, answer one JSON line per case (see module doc)."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    request = json.loads(sys.stdin.read())
    import torch

    from workbench.exercises.common import run_case
    from workbench.exercises.registry import exercise

    torch.set_num_threads(1)
    ex = exercise(request["exercise"])
    ex.prepare()
    fn, error, notes = load_function(request["source"], request["function"])
    if fn is None:
        send({"load_error": error})
        return
    send({"ready": True, "notes": notes})
    for name in request["cases"]:
        send(run_case(ex, name, fn, request["source"]).to_dict())


if __name__ == "__main__":
    main()
