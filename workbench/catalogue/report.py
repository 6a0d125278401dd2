"""The batch report: one self-contained ``index.html`` for a catalogue run.

The page opens with what was run where: the environment (Python, torch, transformers, TRL,
device, CPU model and cores), the wall time of the whole run and the summed time of its notebooks (they differ when
notebooks run in parallel), and one table row per notebook with its verdict and its **headline**
— the one number a reader should remember, measured with the bug and with the fix. Then "Does it
matter?": one row per training consequence a notebook predicted (``metrics["prediction"]``), with its
effect ± s.e., minimum detectable effect and verdict (rows built by ``consequences.py``).

Each notebook's section then leads with that headline, shows the main figure (the one that shows
the claim, named in the notebook's metadata, embedded as a data URI), the key numbers of
``metrics.json`` grouped into bug/fix pairs with their units where the names pair up
(``*_bug``/``*_fix``, ``*_without_*``/``*_with_*``, ``…bug…``/``…fix…`` keys), the other numbers
after them, and the effective parameters the runner injected (seeds, steps; no temporary paths).
No external assets: the file reads the same offline. The page ends with the Exercises section: the reference
solutions of the graded exercises, graded beside the notebooks (``batch.start_exercise_grading``), each of which
must score 1.

A headline that was not measured (NaN: the notebook skipped its measurement, e.g. no peer
environments) reads "not run: `make peers`" — the command named in the notebook's ``skipped`` reason —
never ``nan``; any other undefined number reads "n/a (<why>)" (``core.numbers``: "one seed: no noise estimate" for the
noise, threshold and MDE of a one-seed run). The page is shareable: it names versions, never this machine's paths (the run folder,
the repository, the home and temporary folders are written as ``<run>``, ``<repo>``, ``~``, ``<tmp>``).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import platform
import re
import tempfile
from datetime import datetime
from importlib import metadata
from pathlib import Path

from workbench.catalogue.consequences import HEADER as CONSEQUENCE_HEADER
from workbench.catalogue.consequences import cells as consequence_cells
from workbench.catalogue.consequences import consequence_rows, tally
from workbench.core.numbers import NOT_MEASURED, is_undefined, shown, why_undefined
from workbench.core.paths import REPO_ROOT

VERDICT_CLASS = {"reproduced + fixed": "good", "failed": "bad"}
CONSEQUENCE_CLASS = {"as predicted": "good", "opposite": "bad", "null": "warn"}

BUG_WORDS = ("bug", "without")
FIX_WORDS = ("fix", "with")


def environment() -> dict[str, str]:
    """Versions and device of this process (the kernels inherit the same environment)."""
    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"

    device = "CPU"
    try:
        import torch

        if torch.cuda.is_available():
            device = f"CUDA: {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return {"Python": platform.python_version(), "torch": version("torch"), "transformers": version("transformers"),
            "TRL": version("trl"), "device": device, "CPU": cpu_model(), "CPU cores": str(os.cpu_count()),
            "platform": platform.platform(terse=True)}


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and widest vector extension (Linux: ``/proc/cpuinfo``, e.g. "AMD EPYC (AVX-512)"; else
    ``platform.processor()``), or "unknown": a run's timings and float noise belong to a machine — two 2-core
    machines differed by 1.8x in the catalogue's wall time, and AVX2 and AVX-512 kernels sum in other orders."""
    name, flags = "", set()
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key == "model name" and not name:
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    if not name:
        return platform.processor() or "unknown"
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return f"{name} ({widest})" if widest else name


def _flatten(metrics: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(_flatten(value, name + "."))
        elif isinstance(value, (int, float, bool, str)) or value is None:
            rows.append((name, value))
    return rows


def _side(word: str) -> str | None:
    return "bug" if word in BUG_WORDS else "fix" if word in FIX_WORDS else None


def _pair_key(name: str) -> tuple[str, str] | None:
    """``(name with its bug/fix word replaced by *, side)`` for a metric name that names a side."""
    parts = re.split(r"([._])", name)
    for i, part in enumerate(parts):
        side = _side(part.lower())
        if side is not None:
            return "".join(parts[:i] + ["*"] + parts[i + 1:]), side
    return None


def unit_of(name: str) -> str:
    """A unit guessed from a metric's name (the workbench's naming conventions)."""
    n = name.lower()
    for words, unit in ((("fraction", "rate", "accuracy", "share"), "share"), (("ratio_deviation",), "|ρ − 1|"),
                        (("drift", "logp", "kl", "margin"), "nats"), (("error",), "relative"), (("seconds",), "s"),
                        (("steps",), "steps"), (("tokens", "length"), "tokens"), (("rows",), "rows")):
        if any(w in n for w in words):
            return unit
    return ""


def group_metrics(metrics: dict) -> tuple[list[tuple[str, object, object, str]], list[tuple[str, object]]]:
    """``(pairs, others)``: ``(name, bug value, fix value, unit)`` for names that pair up, the rest as they are."""
    rows = _flatten(metrics)
    sides: dict[str, dict[str, object]] = {}
    for name, value in rows:
        key = _pair_key(name)
        if key is not None:
            sides.setdefault(key[0], {})[key[1]] = value
    pairs, paired = [], set()
    for pattern, values in sides.items():
        if set(values) == {"bug", "fix"}:
            pairs.append((pattern, values["bug"], values["fix"], unit_of(pattern)))
            paired.add(pattern)
    others = [(n, v) for n, v in rows if (_pair_key(n) or ("",))[0] not in paired]
    return pairs, others


_LOCAL_ROOTS: list[tuple[str, str]] = []  # (absolute path, placeholder), longest first; set by write_report


def local_roots(out: Path) -> list[tuple[str, str]]:
    """This machine's folders that may appear in error messages or metrics, and what the report writes instead."""
    roots = {str(Path(out).resolve()): "<run>", str(Path(out).absolute()): "<run>", str(REPO_ROOT): "<repo>",
             str(Path(tempfile.gettempdir()).resolve()): "<tmp>", str(Path.home()): "~"}
    return sorted(((k, v) for k, v in roots.items() if len(k) > 1), key=lambda kv: -len(kv[0]))


def shareable(text: str, roots: list[tuple[str, str]] | None = None) -> str:
    """``text`` with this machine's folders replaced by placeholders (``local_roots``)."""
    for path, placeholder in _LOCAL_ROOTS if roots is None else roots:
        text = text.replace(path, placeholder)
    return text


def _format(value, why: str = NOT_MEASURED) -> str:
    """A metric as the page shows it: floats to 4 significant digits; an undefined one (NaN, or the ``"nan"`` text
    ``core.jsonsafe`` stores) as "n/a (<why>)", never "nan"."""
    if isinstance(value, bool) or value is None:
        return html.escape(str(value))
    if isinstance(value, float) or is_undefined(value):
        return html.escape(shown(value, ".4g", why))
    return html.escape(shareable(str(value)))


def _why(name: str, flat: dict) -> str:
    """Why the flattened metric ``name`` would be undefined, judged from its record's other fields (``a.b.mde`` with
    ``a.b.seeds`` 1: one seed)."""
    prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""
    record = {n[len(prefix):]: v for n, v in flat.items() if n.startswith(prefix) and "." not in n[len(prefix):]}
    return why_undefined(name, record)


def not_run_text(metrics: dict) -> str:
    """Why a notebook's headline was not measured: "not run: `<command>`" when its ``skipped`` reason names one."""
    reason = str((metrics.get("metrics") or {}).get("skipped") or "")
    command = re.search(r"`([^`]+)`", reason)
    return f"not run: `{command.group(1)}`" if command else "not measured" + (f" ({reason[:120]})" if reason else "")


def measured(headline: dict) -> bool:
    return all(isinstance(headline.get(k), (int, float)) and math.isfinite(headline[k]) for k in ("bug", "fix"))


def headline_html(headline: dict | None, metrics: dict | None = None) -> str:
    if not headline:
        return "<p class='headline missing'>no headline number recorded</p>"
    if not measured(headline):
        return (f"<p class='headline missing'><b>{html.escape(headline['what'])}</b>: "
                f"{html.escape(not_run_text(metrics or {}))}</p>")
    unit = html.escape(headline["unit"])
    return (f"<p class='headline'><b>{html.escape(headline['what'])}</b>: "
            f"<span class='bug'>bug {_format(headline['bug'])} {unit}</span> → "
            f"<span class='fix'>fix {_format(headline['fix'])} {unit}</span></p>")


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _section(result, out: Path) -> str:
    verdict = result.verdict
    metrics = result.metrics or {}
    parts = [
        f'<section id="{html.escape(result.stem)}"><h2>{html.escape(result.stem)} '
        f'<span class="verdict {VERDICT_CLASS.get(verdict, "warn")}">{html.escape(verdict)}</span></h2>',
        headline_html(metrics.get("headline"), metrics),
        f"<p>{html.escape(result.purpose)}</p>",
    ]
    folder = Path(result.out_dir)
    rel = folder.relative_to(out) if folder.is_relative_to(out) else Path(folder.name)
    links = [f'<a href="{rel}/{result.stem}.ipynb">executed notebook (.ipynb)</a>']
    if (folder / f"{result.stem}.html").is_file():
        links.append(f'<a href="{rel}/{result.stem}.html">rendered (HTML)</a>')
    parts.append(f"<p>{' · '.join(links)} · notebook time {result.seconds:.1f} s</p>")
    if result.error:
        parts.append(f"<pre class='error'>{html.escape(shareable(result.error))}</pre>")
    if result.main_figure:
        data = base64.b64encode((folder / result.main_figure).read_bytes()).decode()
        parts.append(f'<figure><img alt="{html.escape(result.main_figure)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>main figure: {html.escape(result.main_figure)}</figcaption></figure>")
    if metrics.get("metrics"):
        pairs, others = group_metrics(metrics["metrics"])
        flat = dict(_flatten(metrics["metrics"]))
        if pairs:
            parts.append("<details open><summary>key numbers, bug vs fix</summary>" + _table(
                ["measure", "bug", "fix", "unit"],
                [[html.escape(n), _format(b), _format(f), html.escape(u)] for n, b, f, u in pairs]) + "</details>")
        if others:
            parts.append("<details><summary>other numbers</summary>" + _table(
                ["measure", "value", "unit"],
                [[html.escape(n), _format(v, _why(n, flat)), html.escape(unit_of(n))] for n, v in others[:60]]) + "</details>")
    parameters = metrics.get("parameters") or {k: v for k, v in result.parameters.items() if k != "out_dir"}
    parts.append("<details><summary>effective parameters</summary>" + _table(
        ["parameter", "value"], [[html.escape(k), html.escape(shareable(json.dumps(v)))] for k, v in parameters.items()])
        + "</details></section>")
    return "\n".join(parts)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;border-top:1px solid #ddd;padding-top:1em}
.verdict{font-size:.75em;padding:.15em .5em;border-radius:.4em;margin-left:.5em;color:#fff}
.good{background:#0072B2}.bad{background:#D55E00}.warn{background:#E69F00}
.headline{font-size:1.05em;background:#f6f8fa;padding:.5em;border-left:4px solid #0072B2}
.headline .bug{color:#D55E00;font-weight:600}.headline .fix{color:#0072B2;font-weight:600}
table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.2em .5em;font-family:monospace;text-align:left}
img{max-width:100%;border:1px solid #eee}pre.error{background:#fff3ef;padding:.5em;white-space:pre-wrap}
figcaption{font-size:.8em;color:#555}nav a{margin-right:1em}
"""


def exercises_html(exercises: dict | None) -> str:
    """The Exercises section: the reference solutions graded by ``workbench.exercises`` (CI proves the graders)."""
    if exercises is None:
        return ""
    if "error" in exercises:
        return (f"<section id='exercises'><h2>Exercises <span class='verdict bad'>not graded</span></h2>"
                f"<pre class='error'>{html.escape(shareable(str(exercises['error'])))}</pre></section>")
    grades = exercises.get("grades", [])
    passed = sum(1 for g in grades if g.get("passed"))
    rows = [[html.escape(g["exercise"]), f"{g['score']:.2f}", f"{sum(c['passed'] for c in g['cases'])}/{len(g['cases'])}",
             html.escape("; ".join(f"{c['name']}: {c['got']}" for c in g["cases"] if not c["passed"]) or "—")] for g in grades]
    verdict = "good" if passed == len(grades) and grades else "bad"
    return (f"<section id='exercises'><h2>Exercises <span class='verdict {verdict}'>{passed}/{len(grades)} solutions pass"
            "</span></h2><p>The reference solutions of the graded exercises (<code>notebooks/exercises/</code>), graded by "
            "<code>workbench.exercises</code>: every one must score 1, or a grader is broken.</p>"
            + _table(["exercise", "score", "cases passed", "failed cases"], rows) + "</section>")


def consequences_html(results: list) -> str:
    """The "Does it matter?" section: one row per predicted consequence (``consequences.consequence_rows``);
    empty when no notebook recorded a prediction."""
    rows = consequence_rows({r.stem: r.metrics for r in results if r.metrics})
    if not rows:
        return ""
    body = []
    for row in rows:
        text = [html.escape(shareable(c)) for c in consequence_cells(row)]
        text[0] = f"<a href='#{html.escape(row['notebook'])}'>{text[0]}</a>"
        text[-1] = f"<span class='verdict {CONSEQUENCE_CLASS[row['verdict']]}'>{text[-1]}</span>"
        body.append(text)
    return ("<section id='does-it-matter'><h2>Does it matter?</h2><p>The training consequence each notebook's mechanism "
            "predicts, stated before the run: effect = bug − fix over seeds ± its standard error; it counts as larger when "
            "|effect| exceeds the 95 % t threshold × s.e., whose product is the <b>minimum detectable effect</b> (MDE): "
            "a null reads “no effect &gt; MDE”, the largest effect these seeds rule out. "
            f"{html.escape(tally(rows))}.</p>" + _table(CONSEQUENCE_HEADER, body) + "</section>")


def write_report(out: Path, results: list, *, total_seconds: float, smoke: bool, exercises: dict | None = None) -> Path:
    _LOCAL_ROOTS[:] = local_roots(out)
    failed = sum(1 for r in results if r.verdict == "failed")
    summed = sum(r.seconds for r in results)
    nav = " ".join(f'<a href="#{html.escape(r.stem)}">{html.escape(r.stem)}</a>' for r in results)
    if exercises is not None:
        nav += ' <a href="#exercises">exercises</a>'
    matter = consequences_html(results)
    if matter:
        nav = '<a href="#does-it-matter">does it matter?</a> ' + nav

    def headline_cell(result) -> str:
        headline = (result.metrics or {}).get("headline")
        if not headline:
            return "—"
        if not measured(headline):
            return f"{html.escape(headline['what'])}: {html.escape(not_run_text(result.metrics or {}))}"
        return (f"{html.escape(headline['what'])}: {_format(headline['bug'])} → {_format(headline['fix'])} "
                f"{html.escape(headline['unit'])}")

    summary = _table(["notebook", "verdict", "headline: bug → fix", "notebook time"],
                     [[f"<a href='#{html.escape(r.stem)}'>{html.escape(r.stem)}</a>", html.escape(r.verdict), headline_cell(r),
                       f"{r.seconds:.1f} s" + (" (earlier run, kept)" if getattr(r, "kept", False) else "")] for r in results])
    env = _table(["", ""], [[html.escape(k), html.escape(v)] for k, v in environment().items()])
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>RLHF pitfalls workbench — run report</title>
<style>{CSS}</style></head><body>
<h1>RLHF pitfalls workbench — run report</h1>
<p>{datetime.now():%Y-%m-%d %H:%M} · {len(results)} notebooks · {failed} failed{' · smoke run' if smoke else ''}<br>
wall time of the run: <b>{total_seconds:.0f} s</b> · summed notebook time: <b>{summed:.0f} s</b>
(larger than the wall time when notebooks run in parallel)</p>
<details open><summary>environment</summary>{env}</details>
<nav>{nav}</nav>
{summary}
{matter}
{''.join(_section(r, out) for r in results)}
{exercises_html(exercises)}
<script type="application/json" id="summary">{html.escape(json.dumps([r.stem for r in results]))}</script>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path
