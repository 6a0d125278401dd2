"""The batch report: one self-contained ``index.html`` for a catalogue run.

One section per notebook: its verdict (reproduced / fixed / failed), key numbers from
``metrics.json``, the main figure (embedded as a data URI), the parameters, the duration and
links to the executed notebook (``.ipynb`` and its HTML rendering). No external assets: the file
reads the same offline.
"""

from __future__ import annotations

import base64
import html
import json
from datetime import datetime
from pathlib import Path

VERDICT_CLASS = {"reproduced + fixed": "good", "failed": "bad"}


def _flatten(metrics: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(_flatten(value, name + "."))
        elif isinstance(value, (int, float, bool, str)) or value is None:
            rows.append((name, value))
    return rows


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _section(result, out: Path) -> str:
    verdict = result.verdict
    parts = [
        f'<section id="{html.escape(result.stem)}"><h2>{html.escape(result.stem)} '
        f'<span class="verdict {VERDICT_CLASS.get(verdict, "warn")}">{html.escape(verdict)}</span></h2>',
        f"<p>{html.escape(result.purpose)}</p>",
    ]
    folder = Path(result.out_dir)
    rel = folder.relative_to(out) if folder.is_relative_to(out) else folder
    links = [f'<a href="{rel}/{result.stem}.ipynb">executed notebook (.ipynb)</a>']
    if (folder / f"{result.stem}.html").is_file():
        links.append(f'<a href="{rel}/{result.stem}.html">rendered (HTML)</a>')
    parts.append(f"<p>{' · '.join(links)} · {result.seconds:.1f} s</p>")
    if result.error:
        parts.append(f"<pre class='error'>{html.escape(result.error)}</pre>")
    if result.main_figure:
        data = base64.b64encode((folder / result.main_figure).read_bytes()).decode()
        parts.append(f'<img alt="{html.escape(result.main_figure)}" src="data:image/png;base64,{data}">')
    if result.metrics:
        rows = _flatten(result.metrics.get("metrics", {}))
        if rows:
            body = "".join(f"<tr><td>{html.escape(k)}</td><td>{_format(v)}</td></tr>" for k, v in rows[:40])
            parts.append(f"<details open><summary>key numbers</summary><table>{body}</table></details>")
    params = "".join(f"<tr><td>{html.escape(k)}</td><td>{_format(v)}</td></tr>" for k, v in result.parameters.items())
    parts.append(f"<details><summary>parameters</summary><table>{params}</table></details></section>")
    return "\n".join(parts)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{font-size:1.2em;border-top:1px solid #ddd;padding-top:1em}
.verdict{font-size:.75em;padding:.15em .5em;border-radius:.4em;margin-left:.5em;color:#fff}
.good{background:#0072B2}.bad{background:#D55E00}.warn{background:#E69F00}
table{border-collapse:collapse;font-size:.85em}td{border:1px solid #ddd;padding:.2em .5em;font-family:monospace}
img{max-width:100%;border:1px solid #eee}pre.error{background:#fff3ef;padding:.5em;white-space:pre-wrap}
nav a{margin-right:1em}
"""


def write_report(out: Path, results: list, *, total_seconds: float, smoke: bool) -> Path:
    failed = sum(1 for r in results if r.verdict == "failed")
    nav = " ".join(f'<a href="#{html.escape(r.stem)}">{html.escape(r.stem)}</a>' for r in results)
    summary_rows = "".join(
        f"<tr><td><a href='#{html.escape(r.stem)}'>{html.escape(r.stem)}</a></td><td>{html.escape(r.verdict)}</td>"
        f"<td>{r.seconds:.1f} s</td></tr>"
        for r in results
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>RLHF pitfalls workbench — run report</title>
<style>{CSS}</style></head><body>
<h1>RLHF pitfalls workbench — run report</h1>
<p>{datetime.now():%Y-%m-%d %H:%M} · {len(results)} notebooks · {failed} failed · {total_seconds:.0f} s{' · smoke run' if smoke else ''}</p>
<nav>{nav}</nav>
<table><tr><td><b>notebook</b></td><td><b>verdict</b></td><td><b>duration</b></td></tr>{summary_rows}</table>
{''.join(_section(r, out) for r in results)}
<script type="application/json" id="summary">{html.escape(json.dumps([r.stem for r in results]))}</script>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path
