"""Execute catalogue notebooks in batch with papermill and collect their results.

``run_catalogue`` validates every parameter before anything runs (unknown name or wrong type →
``ParameterError``, exit code 2 on the command line), executes each notebook into
``<out>/<stem>/`` (executed ``.ipynb``, its HTML rendering, PNG figures, ``metrics.json``),
keeps going when one fails, and finishes with ``<out>/index.html`` (see ``report.py``) and
``<out>/summary.json`` (mode, times, when it finished, the environment, each notebook's result).

A notebook is **complete** in ``<out>`` when its folder holds ``result.json`` — the runner's record,
written atomically as the last step of that notebook, after ``metrics.json`` and the executed
``.ipynb`` — and that record says it ran without error with the same effective parameters as now.
``--resume`` runs only the notebooks that are not complete (a ``metrics.json`` from other parameters,
or a folder left by an interrupted run, is run again, and the output says why) and writes one
report over all of them. Ctrl-C writes the report of what finished and leaves the finished
notebooks' files intact (each file is written whole or not at all).

Quiet by construction: the runner injects the parameters itself (it validated them,
``notebooks.resolve_parameters``) instead of letting papermill guess the notebook's parameters from
the cell's text (it misreads a ``=`` in a comment and warns "Passed unknown parameter"), and a kernel
whose cells all finished is shut down without the interrupt (SIGINT) jupyter_client sends first,
which ipykernel logs as "KeyboardInterrupt caught in kernel".
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from workbench.catalogue import kernel_fork
from workbench.catalogue.listing import NotebookInfo, catalogue, find_notebook, resolve_parameters
from workbench.catalogue.notebook_api import read_metrics
from workbench.catalogue.report import environment, write_report
from workbench.core import folder_lock
from workbench.core.errors import ParameterError
from workbench.core.paths import REPO_ROOT, private_folder, remove_private_folder
from workbench.trainers.checkpointing import atomic_write_json


@dataclass
class NotebookResult:
    stem: str
    purpose: str
    out_dir: str
    parameters: dict
    seconds: float
    ok: bool
    error: str | None = None
    metrics: dict | None = None
    figures: list[str] = field(default_factory=list)
    main_figure: str | None = None
    kept: bool = False  # --resume: complete from an earlier run in the same folder, not run again

    @property
    def verdict(self) -> str:
        """``failed``, or which of the bug's signature (reproduced) and its absence (fixed) were shown."""
        if not self.ok or self.metrics is None:
            return "failed"
        reproduced, fixed = self.metrics.get("reproduced"), self.metrics.get("fixed")
        if self.metrics.get("metrics", {}).get("stopped"):
            return "cannot show (see metrics)"
        if reproduced and fixed:
            return "reproduced + fixed"
        skipped = self.metrics.get("metrics", {}).get("skipped")
        if skipped:  # e.g. peer environments absent: no verdict, never "not reproduced"
            command = re.search(r"`([^`]+)`", str(skipped))
            return f"not run: `{command.group(1)}`" if command else "skipped (see metrics)"
        if reproduced:
            return "reproduced, fix not shown"
        if fixed:
            return "fixed, bug not reproduced"
        return "not reproduced"


def default_out_dir() -> Path:
    return REPO_ROOT / "runs" / datetime.now().strftime("%Y%m%d-%H%M%S")


def plan(names: list[str] | None, overrides: dict, smoke: bool) -> list[tuple[NotebookInfo, dict]]:
    """Which notebooks run with which parameters; raises ``ParameterError`` before anything runs.

    A ``-p`` parameter goes to every selected notebook that has it; a name that no selected
    notebook has is an error listing the valid names.
    """
    infos = [find_notebook(n) for n in names] if names else catalogue()
    if not infos:
        raise ParameterError("no notebooks found in notebooks/")
    known = {name for info in infos for name in info.parameters}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ParameterError(
            f"unknown parameter {', '.join(map(repr, unknown))}; valid names: {', '.join(sorted(known))}"
        )
    return [
        (info, resolve_parameters(info, {k: v for k, v in overrides.items() if k in info.parameters}, smoke=smoke))
        for info in infos
    ]


def ipc_kernel_manager():
    """A kernel manager whose kernels talk over local IPC sockets instead of TCP: no "Kernel is
    running over TCP without encryption" warning for every notebook, and nothing listening on a port."""
    from jupyter_client.manager import KernelManager  # jupyter_client: only when notebooks run

    class IPCKernelManager(KernelManager):
        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            # IPC sockets are files named <ip>-<port>; the default <ip> ("kernel-ipc" in the working folder)
            # would be shared by a kernel of an interrupted run still shutting down in the same notebook
            # folder, whose messages then fail the new kernel's signature check. A fresh folder per kernel.
            # (a SIGKILLed run's folders are removed by the next run's private_folder calls)
            made = None
            if "ip" not in kwargs:
                made = private_folder("kernel")
                kwargs["ip"] = str(Path(made) / "kernel")
            super().__init__(**kwargs)
            self._made_folder = made  # removed with the kernel; a folder the caller named is the caller's

        # The kernel's folder goes with its socket files on both of jupyter_client's ways out: ``cleanup_resources()``
        # (nbclient's) and ``shutdown_kernel()``, which awaits the base class's coroutine itself, not the method above.
        def cleanup_resources(self, restart: bool = False) -> None:
            super().cleanup_resources(restart=restart)  # removes the socket files
            if not restart:
                self._remove_made_folder()

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart=restart)
            if not restart:
                self._remove_made_folder()

        def _remove_made_folder(self) -> None:
            if self._made_folder is not None:
                remove_private_folder(self._made_folder)
                self._made_folder = None

        def format_kernel_cmd(self, extra_arguments=None) -> list[str]:
            # a kernel forked from the run's warm zygote when one runs (kernel_fork), else the ordinary command
            return kernel_fork.kernel_command(super().format_kernel_cmd(extra_arguments))

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client interrupts every kernel before its shutdown request; nbclient shuts it down
            # only after the last cell replied, so that SIGINT interrupts nothing and only makes
            # ipykernel log "KeyboardInterrupt caught in kernel". A timeout's interrupt still goes through.
            if self.shutting_down:
                return
            await super()._async_interrupt_kernel()

    return IPCKernelManager


def effective_parameters(info: NotebookInfo, injected: dict) -> dict:
    """The values a run used: the notebook's defaults overridden by what was injected
    (``out_dir``, a run-specific path, left out)."""
    return {name: value for name, value in {**info.parameters, **injected}.items() if name != "out_dir"}


RESULT_FILE = "result.json"  # the runner's record of one notebook, written last: its presence marks a complete run


def parameterized_notebook(info: NotebookInfo, parameters: dict):
    """The notebook with papermill's ``injected-parameters`` cell after its ``parameters`` cell.

    Injected here rather than by ``papermill.execute_notebook(parameters=...)``, which first
    re-parses the parameters cell with its own line-based guesser and warns about names it misreads
    (``Passed unknown parameter: off_policy_steps`` for a line with ``=`` in its comment); the
    runner has already validated every name and type against the cell's real syntax tree.
    """
    from papermill.iorw import load_notebook_node  # papermill: only when notebooks run
    from papermill.parameterize import parameterize_notebook  # papermill: only when notebooks run

    notebook = load_notebook_node(str(info.path))
    return parameterize_notebook(notebook, parameters, kernel_name="python3", language="python")


def _forget_machine_paths(path: Path) -> None:
    """papermill records the notebook's absolute input and output paths in its metadata: keep the file names only, so
    an executed notebook shared with someone names no folder of the machine it ran on."""
    import nbformat  # nbformat: only when notebooks are read

    notebook = nbformat.read(str(path), as_version=4)
    recorded = notebook.metadata.get("papermill", {})
    for key in ("input_path", "output_path"):
        if recorded.get(key):
            recorded[key] = Path(recorded[key]).name
    nbformat.write(notebook, str(path))


def execute(info: NotebookInfo, parameters: dict, out_dir: Path, *, render_html: bool = True) -> NotebookResult:
    """Run one notebook with papermill into ``out_dir`` and collect what it wrote."""
    import nbformat  # nbformat: only when notebooks are read
    import papermill  # papermill: only when notebooks run

    out_dir = Path(out_dir).resolve()  # the kernel runs with cwd=out_dir: a relative path would nest inside itself
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (RESULT_FILE, "metrics.json"):  # an earlier run's files must not pass for this run's
        (out_dir / stale).unlink(missing_ok=True)
    parameters = {**parameters, "out_dir": "."}  # the kernel's cwd: the executed notebook names no folder of this machine
    output = out_dir / f"{info.stem}.ipynb"
    start = time.perf_counter()
    error = None
    try:
        nbformat.write(parameterized_notebook(info, parameters), str(output))
        papermill.execute_notebook(
            str(output), str(output), kernel_name="python3", progress_bar=False, cwd=str(out_dir),
            kernel_manager_class=ipc_kernel_manager(),
        )
    except Exception as exc:  # a failing notebook must not stop the others
        error = _short_error(exc)
    seconds = time.perf_counter() - start
    if output.is_file():
        _forget_machine_paths(output)
    if render_html and output.is_file():
        try:
            render_notebook_html(output)
        except Exception as exc:
            error = error or f"HTML rendering failed: {exc}"
    metrics = read_metrics(out_dir)
    if error is not None and "NotebookStopped" in error and metrics is not None and metrics.get("metrics", {}).get("stopped"):
        error = None  # notebook_api.stop_here: the checkpoint cannot show this pitfall, and metrics.json says why
    if error is None and metrics is None:
        error = "the notebook finished without writing metrics.json"
    if metrics is not None:  # the effective parameters, recorded by the one who injected them
        metrics["parameters"] = effective_parameters(info, parameters)
        atomic_write_json(out_dir / "metrics.json", metrics)
    figures = sorted(p.name for p in out_dir.glob("*.png"))
    wanted = f"{info.main_figure}.png" if info.main_figure else None
    main = wanted if wanted in figures else (figures[0] if figures else None)
    result = NotebookResult(
        stem=info.stem, purpose=info.purpose, out_dir=str(out_dir), parameters=effective_parameters(info, parameters),
        seconds=seconds,
        ok=error is None, error=error, metrics=metrics, figures=figures, main_figure=main,
    )
    atomic_write_json(out_dir / RESULT_FILE, {k: v for k, v in asdict(result).items() if k not in ("metrics", "kept")})
    return result


def _same(a, b) -> bool:
    """Equal as JSON stores them (a tuple and a list of the same values are the same parameter)."""
    return json.loads(json.dumps(a, sort_keys=True)) == json.loads(json.dumps(b, sort_keys=True))


def completed_result(info: NotebookInfo, parameters: dict, folder: Path) -> tuple[NotebookResult | None, str]:
    """``(the earlier result, "")`` when ``folder`` holds a complete run of ``info`` with these parameters
    (module doc), else ``(None, why it runs again)``."""
    record_path = folder / RESULT_FILE
    if not folder.is_dir():
        return None, "not run yet"
    if not record_path.is_file():
        stale = " (a metrics.json without the runner's record: interrupted, or from an older run)" if (
            folder / "metrics.json").is_file() else " (interrupted before it finished)"
        return None, "incomplete" + stale
    try:
        record = json.loads(record_path.read_text())
        result = NotebookResult(**record)
    except (ValueError, TypeError) as exc:
        return None, f"unreadable {RESULT_FILE} ({exc})"
    wanted = effective_parameters(info, parameters)
    if not _same(result.parameters, wanted):
        changed = sorted(k for k in set(wanted) | set(result.parameters) if not _same(wanted.get(k), result.parameters.get(k)))
        return None, "stale: its results are from other parameters (" + ", ".join(
            f"{k}: {result.parameters.get(k)!r} → {wanted.get(k)!r}" for k in changed) + ")"
    if not result.ok:
        return None, "failed last time"
    result.metrics = read_metrics(folder)
    if result.metrics is None or not (folder / f"{info.stem}.ipynb").is_file():
        return None, "incomplete (metrics.json or the executed notebook is missing)"
    result.out_dir, result.kept = str(folder), True
    return result, ""


def _short_error(exc: Exception) -> str:
    name = getattr(exc, "ename", type(exc).__name__)
    value = getattr(exc, "evalue", str(exc))
    text = f"{name}: {value}".strip()
    return text if len(text) < 2000 else text[:2000] + " …"


def render_notebook_html(notebook_path: Path, title: str | None = None) -> Path:
    """The executed notebook as a stand-alone HTML page next to it (images embedded), titled with
    ``title`` (default: the notebook's first heading, else its file name), with no external script."""
    import nbformat  # nbformat: only when notebooks are read
    from nbconvert import HTMLExporter  # nbconvert: only when a report is written

    notebook = nbformat.read(str(notebook_path), as_version=4)
    exporter = HTMLExporter(template_name="lab")
    exporter.mathjax_url = ""  # no external assets: formulas stay as TeX source offline
    resources = {"metadata": {"name": title or notebook_title(notebook, notebook_path)}}
    body, _ = exporter.from_notebook_node(notebook, resources=resources)
    return _write_offline(notebook_path.with_suffix(".html"), body)


def notebook_title(notebook, path: Path) -> str:
    """The first markdown heading of ``notebook`` (``# 01 · S1 — …``), else the file's stem."""
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


_SCRIPT = re.compile(r"<script\b([^>]*)>(.*?)</script>", re.DOTALL)


def _write_offline(path: Path, body: str) -> Path:
    """Drop every script that loads from elsewhere: ``src`` pointing to a URL (require.js, the widget
    manager) or empty (MathJax with no URL), and inline modules importing from a CDN (mermaid). The
    page then reads the same offline; nothing in a batch run needs them (no widget state, no diagrams)."""

    def keep(match) -> str:
        attributes, content = match.group(1), match.group(2)
        source = re.search(r"\ssrc=\"([^\"]*)\"", attributes)
        if source is not None and (source.group(1) == "" or re.match(r"https?://", source.group(1))):
            return ""
        if re.search(r"https?://", content) and ("import" in content or "src" in content):
            return ""
        return match.group(0)

    path.write_text(_SCRIPT.sub(keep, body))
    return path


def _execute_safely(info: NotebookInfo, parameters: dict, out: Path, render_html: bool, threads: int | None) -> NotebookResult:
    """``execute`` that turns any runner failure into a failed result (the other notebooks go on)."""
    if threads is not None:  # inherited by the kernel this process starts
        for variable in kernel_fork.THREAD_VARIABLES:
            os.environ[variable] = str(threads)
    try:
        return execute(info, parameters, out / info.stem, render_html=render_html)
    except Exception:
        return NotebookResult(stem=info.stem, purpose=info.purpose, out_dir=str(out / info.stem), parameters=parameters,
                              seconds=0.0, ok=False, error=traceback.format_exc(limit=3))


def run_catalogue(
    names: list[str] | None = None,
    *,
    smoke: bool = False,
    overrides: dict | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    render_html: bool = True,
    jobs_in_parallel: int = 1,
    resume: bool = False,
    log=print,
    exercises: bool = True,
    fork_kernels: bool = True,
) -> tuple[Path, list[NotebookResult]]:
    """Execute notebooks, then write ``index.html`` and ``summary.json`` into ``out_dir``.

    ``resume``: keep the notebooks already complete in ``out_dir`` (module doc), run the others, and
    report over all of them; ``log`` receives one line per notebook saying which and why.
    Ctrl-C: the report and summary of the notebooks that finished are written, then ``KeyboardInterrupt``
    propagates. ``exercises``: grade the exercises' reference solutions in a process beside the notebooks
    (a few seconds of CPU) for the report's Exercises section. ``fork_kernels``: with two notebooks or more,
    fork each kernel from one warm process that imported torch, transformers and the workbench once
    (``kernel_fork``; Linux; ``WORKBENCH_FORK_KERNELS=0`` or False here: an ordinary kernel per notebook).
    """
    jobs = plan(names, overrides or {}, smoke)
    out = (Path(out_dir) if out_dir else default_out_dir()).resolve()
    # one run per folder at a time: a second (say, `--resume` while the first still works) is RunFolderInUse, exit 2
    with folder_lock.held(out, writer="catalogue run", collision="execute the same notebooks into the same files",
                          fix="name another folder with --out"):
        return _run_in(out, jobs, smoke=smoke, progress=progress, render_html=render_html, jobs_in_parallel=jobs_in_parallel,
                       resume=resume, log=log, exercises=exercises, fork_kernels=fork_kernels)


def _run_in(out: Path, jobs: list, *, smoke: bool, progress: bool, render_html: bool, jobs_in_parallel: int, resume: bool,
            log, exercises: bool, fork_kernels: bool) -> tuple[Path, list[NotebookResult]]:
    """``run_catalogue``'s work in ``out``, which it holds (``core.folder_lock``): the kept results of an earlier run
    (``resume``), the notebooks still to run, the exercises' grading beside them, then the report and ``summary.json``
    (also after Ctrl-C, over the notebooks that finished). Arguments as ``run_catalogue``'s; ``jobs`` from ``plan``."""
    from tqdm.auto import tqdm  # tqdm: optional progress bars

    start = time.perf_counter()
    results: list[NotebookResult | None] = [None] * len(jobs)
    if resume:
        for i, (info, parameters) in enumerate(jobs):
            results[i], why = completed_result(info, parameters, out / info.stem)
            log(f"resume: {info.stem}: " + ("complete, kept" if results[i] else f"{why}; running it"))
    todo = [i for i in range(len(jobs)) if results[i] is None]
    grading = start_exercise_grading(out) if exercises else None
    bar = tqdm(total=len(todo), desc="notebooks", disable=not progress, unit="nb")
    try:
        with kernel_fork.zygote(enabled=fork_kernels and len(todo) > 1, threads=kernel_threads(jobs_in_parallel, len(todo))):
            _run_jobs(jobs, todo, results, out, render_html, jobs_in_parallel, bar)
    except KeyboardInterrupt:
        bar.close()
        if grading is not None:
            grading.kill()
            grading.wait()
        _write_outputs(out, [r for r in results if r is not None], time.perf_counter() - start, smoke)
        log(f"interrupted: {sum(r is not None for r in results)} of {len(jobs)} notebooks complete in {out}; "
            f"run the rest with --out {out} --resume")
        raise
    bar.close()
    results = [r for r in results if r is not None]
    graded = collect_exercise_grading(grading, out) if grading is not None else None
    _write_outputs(out, results, time.perf_counter() - start, smoke, graded)
    return out, results


EXERCISES_JSON = "exercises.json"


def start_exercise_grading(out: Path) -> subprocess.Popen:
    """Grade the exercises' reference solutions in a process beside the notebooks (``python -m workbench.exercises``)."""
    log = open(out / "exercises.log", "w")
    try:
        return subprocess.Popen([sys.executable, "-m", "workbench.exercises", str(out / EXERCISES_JSON)],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        log.close()


def collect_exercise_grading(process: subprocess.Popen, out: Path, timeout_s: float = 300.0) -> dict:
    """The solutions' grades (``{"grades": [...]}``) or why there are none (``{"error": ...}``)."""
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return {"error": f"grading the solutions took longer than {timeout_s:.0f} s"}
    path = out / EXERCISES_JSON
    if code != 0 or not path.is_file():
        tail = (out / "exercises.log").read_text(errors="replace")[-300:] if (out / "exercises.log").is_file() else ""
        return {"error": f"grading the solutions exited with code {code}: {tail}"}
    return {"grades": json.loads(path.read_text())}


def _write_outputs(out: Path, results: list[NotebookResult], total: float, smoke: bool, exercises: dict | None = None) -> None:

    write_report(out, results, total_seconds=total, smoke=smoke, exercises=exercises)
    atomic_write_json(
        out / "summary.json",
        {"smoke": smoke, "total_seconds": total, "finished": datetime.now().isoformat(timespec="seconds"),
         "environment": environment(), "notebooks": [{**asdict(r), "verdict": r.verdict} for r in results],
         **({"exercises": exercises} if exercises is not None else {})},
    )


def kernel_threads(jobs_in_parallel: int, notebooks: int) -> int | None:
    """The CPU threads each kernel gets (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``): the cores shared between the
    kernels that run at once, or None (the libraries' own default) when one runs at a time."""
    workers = max(1, min(jobs_in_parallel, notebooks))
    return max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None


def _run_jobs(jobs, todo: list[int], results: list, out: Path, render_html: bool, jobs_in_parallel: int, bar) -> None:
    """Execute ``jobs[i]`` for each ``i`` in ``todo`` into ``results[i]``, one or several at once."""
    workers = max(1, min(jobs_in_parallel, len(todo)))
    if workers == 1:
        for i in todo:
            info, parameters = jobs[i]
            bar.set_postfix_str(info.stem)
            results[i] = _execute_safely(info, parameters, out, render_html, threads=None)
            bar.update(1)
    else:
        # Several kernels at once, each limited to its share of the CPU cores. Workers are spawned,
        # not forked: a fork of a process that already runs threads (torch, tokenizers, tqdm) can
        # inherit a held lock and hang forever.
        threads = kernel_threads(jobs_in_parallel, len(todo))
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            # Longest first, so the last notebooks to finish are short ones: the notebooks that train (a
            # ``seeds`` parameter) are the long ones, in smoke and full mode alike. Results keep catalogue order.
            order = sorted(todo, key=lambda i: "seeds" not in jobs[i][0].parameters)
            futures = {pool.submit(_execute_safely, *jobs[i], out, render_html, threads): i for i in order}
            try:
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    bar.set_postfix_str(results[futures[future]].stem)
                    bar.update(1)
            except KeyboardInterrupt:  # do not wait for the notebooks still running (they were interrupted too)
                pool.shutdown(wait=False, cancel_futures=True)
                raise
