"""The run report: headline first, bug/fix pairs with units, effective parameters, environment, both times."""

import re

import matplotlib
import pytest

matplotlib.use("Agg")

from workbench.catalogue import report  # noqa: E402
from workbench.catalogue.batch import NotebookResult, notebook_title, render_notebook_html  # noqa: E402


@pytest.fixture
def result(tmp_path):
    import matplotlib.pyplot as plt

    folder = tmp_path / "01_x"
    folder.mkdir()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(folder / "claim.png")
    plt.close(fig)
    metrics = {"notebook": "01_x", "parameters": {"seed": 0, "steps": 3}, "reproduced": True, "fixed": True,
               "metrics": {"drift_without_position_ids": {"gpt2": 0.41}, "drift_with_position_ids": {"gpt2": 0.0},
                           "max_ratio_deviation_bug": 0.5, "max_ratio_deviation_fix": 1e-7, "packed_speedup": 2.0},
               "headline": {"what": "max drift", "unit": "nats", "bug": 0.41, "fix": 0.0}}
    return NotebookResult(stem="01_x", purpose="S1 · a purpose", out_dir=str(folder),
                          parameters={"seed": 0, "out_dir": "/tmp/abc"}, seconds=12.5, ok=True, metrics=metrics,
                          figures=["claim.png"], main_figure="claim.png")


def test_metrics_pair_up_by_name_with_units():
    pairs, others = report.group_metrics({"drift_without_position_ids": {"gpt2": 0.4}, "drift_with_position_ids": {"gpt2": 0.0},
                                          "finished_fraction_bug": 0.0, "finished_fraction_fix": 0.9, "ppo": {"bug": 1, "fix": 2},
                                          "packed_with_cache": 3.0, "speedup": 2.0})
    assert ("drift_*_position_ids.gpt2", 0.4, 0.0, "nats") in pairs
    assert ("finished_fraction_*", 0.0, 0.9, "share") in pairs and ("ppo.*", 1, 2, "") in pairs
    assert dict(others) == {"packed_with_cache": 3.0, "speedup": 2.0}  # one side only: not a pair


def test_section_leads_with_the_headline_and_hides_temporary_paths(tmp_path, result):
    path = report.write_report(tmp_path, [result], total_seconds=20.0, smoke=True)
    page = path.read_text()
    section = page[page.index('<section id="01_x">'):]
    assert section.index("class='headline'") < section.index("<img")  # headline before the figure
    assert "bug 0.41 nats" in section and "fix 0 nats" in section
    assert "drift_*_position_ids.gpt2" in section and "max_ratio_deviation_*" in section
    assert "/tmp/abc" not in page and "&quot;steps&quot;" not in page and ">steps<" in section  # effective parameters
    assert "wall time of the run: <b>20 s</b>" in page and "summed notebook time: <b>12 s</b>" in page
    for name in ("Python", "torch", "transformers", "TRL", "device"):
        assert f"<td>{name}</td>" in page
    assert "main figure: claim.png" in section
    assert "http://" not in page and "https://" not in page


def test_a_notebook_without_headline_says_so(tmp_path, result):
    del result.metrics["headline"]
    assert "no headline number recorded" in report.write_report(tmp_path, [result], total_seconds=1, smoke=False).read_text()


def test_rendered_page_is_titled_and_offline(tmp_path):
    import nbformat

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 07 · P7 — Dropout\n\ntext"),
                                               nbformat.v4.new_code_cell("1 + 1")])
    path = tmp_path / "07_dropout.ipynb"
    nbformat.write(notebook, str(path))
    assert notebook_title(notebook, path) == "07 · P7 — Dropout"
    page = render_notebook_html(path).read_text()
    assert re.search(r"<title>07 · P7 — Dropout</title>", page)
    scripts = re.findall(r"<script\b[^>]*>.*?</script>", page, re.DOTALL)
    assert not [s for s in scripts if re.search(r"(src=\"https?://|import\(\"https?://|src=\"\")", s)]
    assert "cdnjs" not in page and "unpkg" not in page


def test_a_headline_not_measured_says_not_run_never_nan(tmp_path):
    metrics = {"reproduced": False, "fixed": False,
               "metrics": {"skipped": "12 bug/fix probes not measured, e.g. trl 0.11.4: no environment (run `make peers`)"},
               "headline": {"what": "S3 decoding steps", "unit": "steps", "bug": float("nan"), "fix": float("nan")}}
    skipped = NotebookResult(stem="90_peer_lab", purpose="peers", out_dir=str(tmp_path / "90_peer_lab"), parameters={},
                             seconds=1.0, ok=True, metrics=metrics)
    page = report.write_report(tmp_path, [skipped], total_seconds=1, smoke=True).read_text()
    assert skipped.verdict == "not run: `make peers`"
    assert page.count("S3 decoding steps: not run: `make peers`") == 1  # the summary row
    assert "<b>S3 decoding steps</b>: not run: `make peers`" in page  # the section's headline
    assert "nan" not in page.lower().replace("nanum", "")


def test_the_page_names_no_path_of_this_machine(tmp_path):
    """Paths in errors, metrics and parameters (run folder, repository, home, temporary folder) are written as placeholders."""
    from pathlib import Path

    from workbench.core.paths import REPO_ROOT

    out = tmp_path / "run"
    folder = out / "90_peer_lab"
    folder.mkdir(parents=True)
    home = str(Path.home())
    metrics = {"reproduced": True, "fixed": True,
               "metrics": {"environments": {"trl-0.11.4": {"python": "3.11.9", "trl": "0.11.4",
                                                           "note": f"{home}/.cache/workbench/peers/trl-0.11.4/bin/python"}},
                           "repo_file": f"{REPO_ROOT}/workbench/runner.py", "bug_value": 1.0, "fix_value": 0.0},
               "parameters": {"data": f"{out}/x.json"},
               "headline": {"what": "steps", "unit": "steps", "bug": 3.0, "fix": 1.0}}
    result = NotebookResult(stem="90_peer_lab", purpose="p", out_dir=str(folder), parameters={"out_dir": str(folder)},
                            seconds=1.0, ok=False, error=f"FileNotFoundError: {tmp_path}/nothing and {REPO_ROOT}/notebooks",
                            metrics=metrics)
    page = report.write_report(out, [result], total_seconds=1, smoke=False).read_text()
    for path in {str(tmp_path), str(REPO_ROOT), home}:
        assert path not in page
    assert "~/.cache/workbench/peers" in page and "&lt;repo&gt;/workbench/runner.py" in page


def test_peer_environment_records_versions_not_paths():
    from workbench.peers.protocol import environment

    env = environment("torch")
    assert "executable" not in env and env["python"].count(".") == 2
    assert not any("/" in str(v) for v in env.values() if not isinstance(v, dict))


def test_a_one_seed_smoke_run_says_why_its_noise_and_mde_are_undefined_never_nan(tmp_path):
    one_seed = {"consequence": "wrong answers grow longer", "direction": "+", "effect": 0.5, "se": "nan", "threshold": "nan",
                "mde": "nan", "larger": False, "seeds": 1, "task": "sums", "measure": "incorrect_length", "agrees": False}
    metrics = {"reproduced": True, "fixed": True, "headline": {"what": "length", "unit": "tokens", "bug": 3.0, "fix": 2.0},
               "metrics": {"prediction": one_seed, "length_bug": 3.0, "length_fix": float("nan"), "gain": float("nan")}}
    smoke = NotebookResult(stem="05_x", purpose="p", out_dir=str(tmp_path / "05_x"), parameters={}, seconds=1.0, ok=True,
                           metrics=metrics)
    page = report.write_report(tmp_path, [smoke], total_seconds=1, smoke=True).read_text()
    assert "<td>0.5 ± n/a (one seed: no noise estimate)</td><td>n/a (one seed: no noise estimate)</td>" in page  # the table
    for field in ("se", "threshold", "mde"):  # the section's other numbers
        assert f"<td>prediction.{field}</td><td>n/a (one seed: no noise estimate)</td>" in page
    assert "<td>gain</td><td>n/a (not measured)</td>" in page and "<td>n/a (not measured)</td>" in page  # length_fix
    assert not re.search(r"\bnan\b", page.lower())
