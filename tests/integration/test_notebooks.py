"""The catalogue: notebook conventions, and every notebook executed with --smoke via the runner."""

import json
import re
import tempfile
from pathlib import Path

import nbformat
import pytest

from workbench.catalogue.batch import run_catalogue
from workbench.catalogue.listing import DECLARED_ABSENCES, NOTEBOOKS_DIR, catalogue, parse_parameters, read_notebook_info
from workbench.core.paths import REPO_ROOT

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
STEMS = [p.stem for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STEMS)
def test_committed_without_outputs(path):
    notebook = nbformat.read(str(path), as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear outputs before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STEMS)
def test_first_cell_names_the_pitfall_second_is_the_literal_parameters_cell(path):
    notebook = nbformat.read(str(path), as_version=4)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
    second = notebook.cells[1]
    assert "parameters" in second.metadata.get("tags", [])
    parameters = parse_parameters(second.source)  # raises on anything but literals
    info = read_notebook_info(path)
    assert info.missing_required() == [], f"{path.name}: add {info.missing_required()} or say why in its metadata ({DECLARED_ABSENCES})"
    assert not set(info.absences) & set(parameters), f"{path.name}: declares no {sorted(info.absences)} but has the parameter"
    meta = notebook.metadata["workbench"]
    assert meta["purpose"]
    assert set(meta.get("smoke_parameters", {})) <= set(parameters)
    assert notebook.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STEMS)
def test_notebook_is_parameters_calls_and_plots(path):
    """A notebook is parameters, calls and plots of its pitfall module (every notebook)."""
    import re

    notebook = nbformat.read(str(path), as_version=4)
    code = [c.source for c in notebook.cells if c.cell_type == "code"]
    lines = [line for source in code for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(lines) <= 60, f"{path.name}: {len(lines)} code lines; move logic, figures and verdicts into its pitfall module"
    raw = [line for line in lines if re.search(r"\b(ax|axes)(\[[^]]*\])?\.\w+\(|import ipywidgets|\binteract\(", line)]
    assert not raw, f"{path.name} draws or builds widgets itself: {raw}"
    assert re.fullmatch(r"notebook_api\.write_metrics\(out, \*\*\w+\.metrics\(.*\)\)", " ".join(code[-1].split()), re.S)
    if "interactive" in parse_parameters(code[0]):
        shows = r"^if interactive:\n(\s+from IPython\.display import display\n\n)?\s+display\(\w+\.\w+_explorer\("
        assert any(re.search(shows, source) for source in code), f"{path.name} has an interactive parameter but shows no explorer"


def test_catalogue_has_the_seed_notebooks():
    stems = {info.stem for info in catalogue()}
    assert {"00_quickstart", "01_position_ids", "02_right_padding_flash_attention", "03_eos_termination",
            "04_dpo_loss_mask", "05_grpo_loss_normalization", "06_temperature", "07_dropout", "08_pad_equals_eos",
            "09_kl_estimators", "10_grad_accumulation", "11_truncated_responses", "12_logprob_mismatch",
            "13_whitening"} <= stems


# The smoke catalogue in the default suite: the quickstart and the five core pitfalls, whose metrics contracts are tested
# below. Every other notebook's smoke run is marked `slow` here (its pitfall module's bug and fix are tested in-process
# by tests/pitfalls/test_nb*.py); .ci/run runs them all (`pytest -m slow tests/integration/test_notebooks.py`), and
# `make test-catalogue` does the same by hand: the whole catalogue's smoke run would dominate make test's time.
DEFAULT_SMOKE = ("00_quickstart", "01_position_ids", "02_right_padding_flash_attention", "03_eos_termination",
                 "04_dpo_loss_mask", "05_grpo_loss_normalization")
SMOKE_PARAMS = [pytest.param(stem, marks=() if stem in DEFAULT_SMOKE else pytest.mark.slow) for stem in STEMS]


@pytest.fixture(scope="session")
def smoke_run(request, tmp_path_factory):
    """One smoke run (``-j 2``) of exactly the notebooks the selected tests read: each selected ``test_every_notebook_…``
    case's notebook, and the default ones when a contract or report test (no ``stem`` of its own) was selected."""
    readers = [item for item in request.session.items if "smoke_run" in getattr(item, "fixturenames", ())]
    params = [getattr(getattr(item, "callspec", None), "params", {}) for item in readers]
    selected = {p["stem"] for p in params if "stem" in p}
    if any("stem" not in p for p in params):
        selected |= set(DEFAULT_SMOKE)
    stems = [stem for stem in STEMS if stem in selected]
    out = tmp_path_factory.mktemp("smoke")
    folder, results = run_catalogue(stems, smoke=True, out_dir=out, progress=False, render_html=False, jobs_in_parallel=2)
    return folder, {r.stem: r for r in results}


def metrics_of(smoke_run, stem):
    folder, results = smoke_run
    result = results[stem]
    assert result.ok, result.error
    payload = json.loads((folder / stem / "metrics.json").read_text())
    assert set(payload) - {"headline"} == {"notebook", "parameters", "reproduced", "fixed", "metrics"}
    assert payload["notebook"] == stem and payload["parameters"]["smoke"] is True
    assert list((folder / stem).glob("*.png")), "the notebook saved no figure"
    return payload


@pytest.mark.parametrize("stem", SMOKE_PARAMS)
def test_every_notebook_reproduces_the_bug_and_shows_the_fix_in_smoke_mode(smoke_run, stem):
    payload = metrics_of(smoke_run, stem)
    if payload["metrics"].get("skipped"):  # the peer lab without its environments: reported, not judged
        pytest.skip(payload["metrics"]["skipped"])
    assert payload["reproduced"] is True and payload["fixed"] is True


@pytest.mark.parametrize("stem", SMOKE_PARAMS)
def test_every_figure_is_readable_at_notebook_width(smoke_run, stem):
    """Every figure the notebook saved, as ``viz.legibility`` measured it at save time: no text under 8 pt in a
    1000-px output area, no overlapping text, no numeric tick label written twice along an axis."""
    folder, results = smoke_run
    assert results[stem].ok, results[stem].error
    checks = json.loads((folder / stem / "figures.json").read_text())
    problems = {name: check["problems"] for name, check in checks.items() if check["problems"]}
    assert not problems, f"{stem}: " + json.dumps(problems, indent=1, ensure_ascii=False)


RAW_NAN = re.compile(r"(?<![A-Za-z_])nan(?![A-Za-z_(])")  # a float printed as nan, not the word "NaN" in a sentence


@pytest.mark.parametrize("stem", SMOKE_PARAMS)
def test_outputs_name_no_folder_of_the_machine_and_no_raw_nan(smoke_run, stem):
    """An executed notebook is shared: its outputs print paths relative to where it ran, and an undefined statistic
    says why instead of printing nan."""
    folder, results = smoke_run
    assert results[stem].ok, results[stem].error
    notebook = nbformat.read(str(folder / stem / f"{stem}.ipynb"), as_version=4)
    machine = [str(REPO_ROOT), str(folder), str(Path.home()), tempfile.gettempdir() + "/"]
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            text = output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
            for root in machine:
                assert root not in text, f"{stem} cell {index} prints a folder of this machine ({root}): {text[:300]}"
            assert not RAW_NAN.search(text), f"{stem} cell {index} prints a raw nan: {text[:300]}"


def test_report_links_every_notebook(smoke_run):
    folder, results = smoke_run
    html = (folder / "index.html").read_text()
    for stem in results:
        assert f'id="{stem}"' in html and f"{stem}/{stem}.ipynb" in html
    assert "http://" not in html and "https://" not in html  # no external assets
    summary = json.loads((folder / "summary.json").read_text())
    assert {n["stem"] for n in summary["notebooks"]} == set(results)


def test_position_ids_metrics_contract(smoke_run):
    m = metrics_of(smoke_run, "01_position_ids")["metrics"]
    assert set(m["drift_without_position_ids"]) == {"llama", "qwen2", "gpt2"}
    assert m["drift_without_position_ids"]["gpt2"] > 1e-2
    assert max(m["drift_with_position_ids"].values()) <= 1e-4
    assert m["drift_without_position_ids"]["llama"] < 1e-5  # RoPE: float noise only


def test_eos_metrics_contract(smoke_run):
    m = metrics_of(smoke_run, "03_eos_termination")["metrics"]
    assert m["tokens_generated_bug"] > m["tokens_generated_fix"] >= m["tokens_needed"]
    assert 0 < m["waste_fraction_bug"] < 1
    assert m["eos_actions_in_mask_pad_equals_eos"] == 0 < m["eos_actions_in_mask_pad_distinct"]


def test_grpo_normalisation_metrics_contract(smoke_run):
    m = metrics_of(smoke_run, "05_grpo_loss_normalization")["metrics"]
    assert set(m["zero_loss_probe"]) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}
    assert abs(m["zero_loss_probe"]["seq-mean-token-mean"]) <= 1e-7 < abs(m["zero_loss_probe"]["token-mean"])


def test_right_padding_metrics_contract(smoke_run):
    m = metrics_of(smoke_run, "02_right_padding_flash_attention")["metrics"]
    assert sum(m["right_padding_divergent_rows"].values()) > 0
    assert sum(m["left_padding_divergent_rows"].values()) == 0
    assert m["packed_max_abs_logp_diff"] <= 1e-5 < m["packed_with_cache_max_abs_logp_diff"]
    assert m["packed_speedup"] > 0 and m["ppo_masks_right_padded"] is True


def test_dpo_mask_metrics_contract(smoke_run):
    m = metrics_of(smoke_run, "04_dpo_loss_mask")["metrics"]
    assert m["margin_gap_step0"] == 0.0
    assert set(m["prompt_logp_drift"]) == {"both", "chosen_only", "none"}
    assert m["rows_counting_prompt_tokens"] == {"both": 0, "chosen_only": 6, "none": 12}
