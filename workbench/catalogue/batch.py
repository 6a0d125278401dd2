"""Execute catalogue notebooks in batch with papermill and collect their results.

``run_catalogue`` validates every parameter before anything runs (unknown name or wrong type →
``ParameterError``, exit code 2 on the command line), executes each notebook into
``<out>/<stem>/`` (executed ``.ipynb``, its HTML rendering, PNG figures, ``metrics.json``),
keeps going when one fails, and finishes with ``<out>/index.html`` (see ``report.py``) and
``<out>/summary.json``.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from workbench.catalogue.listing import NotebookInfo, catalogue, find_notebook, resolve_parameters
from workbench.catalogue.notebook_api import read_metrics
from workbench.core.errors import ParameterError
from workbench.core.paths import REPO_ROOT
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
        if self.metrics.get("metrics", {}).get("skipped"):  # e.g. peer environments absent: no verdict, never "not reproduced"
            return "skipped (see metrics)"
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
    from jupyter_client.manager import KernelManager

    class IPCKernelManager(KernelManager):
        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            super().__init__(**kwargs)

    return IPCKernelManager


def effective_parameters(info: NotebookInfo, injected: dict) -> dict:
    """The values a run used: the notebook's defaults overridden by what was injected
    (``out_dir``, a run-specific path, left out)."""
    return {name: value for name, value in {**info.parameters, **injected}.items() if name != "out_dir"}


def execute(info: NotebookInfo, parameters: dict, out_dir: Path, *, render_html: bool = True) -> NotebookResult:
    """Run one notebook with papermill into ``out_dir`` and collect what it wrote."""
    import logging

    import papermill

    # papermill's own parameter parser warns on any '=' in a comment or string; the workbench
    # validates parameters itself (notebooks.resolve_parameters), so its guesses are noise here.
    logging.getLogger("papermill.translators").setLevel(logging.ERROR)
    out_dir.mkdir(parents=True, exist_ok=True)
    parameters = {**parameters, "out_dir": str(out_dir)}
    output = out_dir / f"{info.stem}.ipynb"
    start = time.perf_counter()
    error = None
    try:
        papermill.execute_notebook(
            str(info.path), str(output), parameters=parameters, kernel_name="python3", progress_bar=False, cwd=str(out_dir),
            kernel_manager_class=ipc_kernel_manager(),
        )
    except Exception as exc:  # a failing notebook must not stop the others
        error = _short_error(exc)
    seconds = time.perf_counter() - start
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
    return NotebookResult(
        stem=info.stem, purpose=info.purpose, out_dir=str(out_dir), parameters=effective_parameters(info, parameters),
        seconds=seconds,
        ok=error is None, error=error, metrics=metrics, figures=figures, main_figure=main,
    )


def _short_error(exc: Exception) -> str:
    name = getattr(exc, "ename", type(exc).__name__)
    value = getattr(exc, "evalue", str(exc))
    text = f"{name}: {value}".strip()
    return text if len(text) < 2000 else text[:2000] + " …"


def render_notebook_html(notebook_path: Path, title: str | None = None) -> Path:
    """The executed notebook as a stand-alone HTML page next to it (images embedded), titled with
    ``title`` (default: the notebook's first heading, else its file name), with no external script."""
    import nbformat
    from nbconvert import HTMLExporter

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
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
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
) -> tuple[Path, list[NotebookResult]]:
    """Execute notebooks, then write ``index.html`` and ``summary.json`` into ``out_dir``."""
    from tqdm.auto import tqdm

    from workbench.catalogue.report import write_report

    jobs = plan(names, overrides or {}, smoke)
    out = Path(out_dir) if out_dir else default_out_dir()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    bar = tqdm(total=len(jobs), desc="notebooks", disable=not progress, unit="nb")
    results: list[NotebookResult | None] = [None] * len(jobs)
    workers = max(1, min(jobs_in_parallel, len(jobs)))
    if workers == 1:
        for i, (info, parameters) in enumerate(jobs):
            bar.set_postfix_str(info.stem)
            results[i] = _execute_safely(info, parameters, out, render_html, threads=None)
            bar.update(1)
    else:
        # Several kernels at once, each limited to its share of the CPU cores. Workers are spawned,
        # not forked: a fork of a process that already runs threads (torch, tokenizers, tqdm) can
        # inherit a held lock and hang forever (seen in a CI rehearsal).
        threads = max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            # Longest first, so the last notebooks to finish are short ones: the notebooks that train (a
            # ``seeds`` parameter) are the long ones, in smoke and full mode alike. Results keep catalogue order.
            order = sorted(range(len(jobs)), key=lambda i: "seeds" not in jobs[i][0].parameters)
            futures = {pool.submit(_execute_safely, *jobs[i], out, render_html, threads): i for i in order}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                bar.set_postfix_str(results[futures[future]].stem)
                bar.update(1)
    bar.close()
    results = [r for r in results if r is not None]
    total = time.perf_counter() - start
    write_report(out, results, total_seconds=total, smoke=smoke)
    atomic_write_json(
        out / "summary.json",
        {"smoke": smoke, "total_seconds": total, "notebooks": [{**asdict(r), "verdict": r.verdict} for r in results]},
    )
    return out, results
