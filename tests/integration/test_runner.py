"""The command line: listing, parameter validation (exit code 2), failures that do not stop the others."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from workbench.catalogue.listing import NOTEBOOKS_DIR, find_notebook, parse_parameters, resolve_parameters
from workbench.cli.main import main
from workbench.core.config_options import convert_value
from workbench.core.errors import ParameterError


def test_list_shows_every_notebook_with_parameters(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for path in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"):
        assert path.stem in out
    assert "parameters: model=" in out


def test_parameters_cell_must_hold_literals_only():
    assert parse_parameters("a = 1\nb = 'x'  # c\nc = [1, 2]") == {"a": 1, "b": "x", "c": [1, 2]}
    with pytest.raises(ParameterError, match="literal"):
        parse_parameters("a = 1\nb = a + 1")
    with pytest.raises(ParameterError, match="assignments"):
        parse_parameters("import os")


def test_values_are_converted_to_the_default_type():
    assert convert_value("seed", "3", 0) == 3
    assert convert_value("smoke", "true", False) is True
    assert convert_value("lr", "1e-3", 0.1) == 1e-3
    assert convert_value("sizes", "[1, 2]", [4]) == [1, 2]
    with pytest.raises(ParameterError, match="expects an int"):
        convert_value("seed", "three", 0)
    with pytest.raises(ParameterError, match="expects true or false"):
        convert_value("smoke", "maybe", False)
    with pytest.raises(ParameterError, match="expects a list"):
        convert_value("sizes", "{1: 2}", [4])


def test_unknown_parameter_is_an_error_listing_valid_names():
    info = find_notebook("00_quickstart")
    with pytest.raises(ParameterError, match="valid names: model, seed"):
        resolve_parameters(info, {"sed": "1"})


def test_cli_unknown_parameter_exits_2_with_the_valid_names(tmp_path, capsys):
    assert main(["run", "00_quickstart", "-p", "sed", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown parameter 'sed'" in err and "seed" in err
    assert not (tmp_path / "00_quickstart").exists()  # nothing ran


def test_cli_device_names_are_checked_before_anything_runs(tmp_path, capsys, monkeypatch):
    assert main(["run", "00_quickstart", "-p", "device", "tpu", "--out", str(tmp_path)]) == 2
    assert "parameter 'device' = 'tpu' is not a device name" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # refused here, not in a started kernel
    assert main(["run", "00_quickstart", "-p", "device", "cuda", "--out", str(tmp_path)]) == 2
    assert "'cuda' was asked for but this machine has no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "00_quickstart").exists()  # nothing ran


def test_cli_an_output_folder_that_cannot_be_made_exits_2_with_the_option(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["run", "00_quickstart", "--out", str(blocker / "run")]) == 2  # not a traceback and exit 1
    err = capsys.readouterr().err
    assert f"cannot make the output folder {blocker / 'run'}: Not a directory; name another folder with --out" in err


def test_cli_wrong_type_and_unknown_notebook_exit_2(tmp_path, capsys):
    assert main(["run", "00_quickstart", "-p", "seed", "x", "--out", str(tmp_path)]) == 2
    assert "expects an int" in capsys.readouterr().err
    assert main(["run", "99_nothing", "--out", str(tmp_path)]) == 2
    assert "choose one of" in capsys.readouterr().err


def test_a_folder_another_catalogue_run_holds_exits_2_and_runs_nothing(tmp_path, capsys, hold_elsewhere):
    with hold_elsewhere(tmp_path, "catalogue run"):  # as a run in another terminal holds it
        assert main(["run", "35_multiturn_tool_tokens", "--smoke", "--out", str(tmp_path), "--quiet", "--no-html"]) == 2
    err = capsys.readouterr().err
    assert "is being written by another catalogue run (pid " in err and "--out" in err
    assert not (tmp_path / "35_multiturn_tool_tokens").exists() and not (tmp_path / "summary.json").exists()


def test_module_entry_point_exit_code():
    done = subprocess.run([sys.executable, "-m", "workbench", "run", "00", "-p", "nope", "1"], capture_output=True, text=True)
    assert done.returncode == 2 and "valid names" in done.stderr


def test_a_failing_notebook_does_not_stop_the_others(tmp_path):
    notebook = nbformat.read(str(NOTEBOOKS_DIR / "35_multiturn_tool_tokens.ipynb"), as_version=4)  # the quickest notebook
    notebook.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('boom')"))
    broken = tmp_path / "99_broken.ipynb"
    nbformat.write(notebook, str(broken))
    code = main(["run", str(broken), "35_multiturn_tool_tokens", "--smoke", "--out", str(tmp_path / "out"), "--quiet", "--no-html"])
    assert code == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    verdicts = {n["stem"]: n for n in summary["notebooks"]}
    assert verdicts["99_broken"]["verdict"] == "failed" and "boom" in verdicts["99_broken"]["error"]
    assert verdicts["35_multiturn_tool_tokens"]["verdict"] == "reproduced + fixed"
    assert "boom" in (tmp_path / "out" / "index.html").read_text()


def test_rendered_notebook_html_has_no_external_scripts(tmp_path):
    from workbench.catalogue.batch import render_notebook_html

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# hi"), nbformat.v4.new_code_cell("1")])
    path = tmp_path / "x.ipynb"
    nbformat.write(notebook, str(path))
    html = render_notebook_html(path).read_text()
    assert "<h1" in html and 'src="http' not in html


def test_a_run_whose_measurements_were_skipped_has_no_negative_verdict():
    from workbench.catalogue.batch import NotebookResult

    def result(metrics):
        return NotebookResult(stem="90_peer_lab", purpose="", out_dir="", parameters={}, seconds=1.0, ok=True, metrics=metrics)

    skipped = {"reproduced": False, "fixed": False, "metrics": {"skipped": "12 bug/fix probes not measured (run `make peers`)"}}
    assert result(skipped).verdict == "not run: `make peers`"
    assert result({**skipped, "metrics": {"skipped": "no GPU"}}).verdict == "skipped (see metrics)"
    assert result({"reproduced": False, "fixed": False, "metrics": {}}).verdict == "not reproduced"
    assert result({**skipped, "reproduced": True, "fixed": True}).verdict == "reproduced + fixed"


def test_an_interrupted_batch_run_resumes_with_only_the_missing_notebook(tmp_path, capsys):
    """A run killed after its first notebook finished; --resume runs only the second and reports both."""
    import os
    import signal
    import time

    out = tmp_path / "out"
    command = [sys.executable, "-m", "workbench", "run", "09_kl_estimators", "16_group_statistics", "--smoke", "--out", str(out),
               "-j", "1", "--quiet", "--no-html"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = out / "09_kl_estimators" / "result.json"
    try:
        deadline = time.monotonic() + 300
        while not first.is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.is_file(), "the first notebook did not finish"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # a killed process: no chance to clean up
        process.wait()
    record = first.read_text()
    assert not (out / "16_group_statistics" / "result.json").is_file() and not (out / "summary.json").is_file()

    assert main([*command[3:], "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "resume: 09_kl_estimators: complete, kept" in printed and "resume: 16_group_statistics: " in printed
    assert first.read_text() == record  # not run again
    summary = {n["stem"]: n for n in json.loads((out / "summary.json").read_text())["notebooks"]}
    assert summary["09_kl_estimators"]["kept"] and not summary["16_group_statistics"]["kept"]
    assert {n["verdict"] for n in summary.values()} == {"reproduced + fixed"}
    page = (out / "index.html").read_text()
    assert 'id="09_kl_estimators"' in page and 'id="16_group_statistics"' in page

    # other parameters: the kept result is stale, and the reason names the parameter (what --resume prints before running it
    # again; the rerun itself is the same path as the first run above)
    from workbench.catalogue.batch import completed_result
    from workbench.catalogue.listing import find_notebook

    info = find_notebook("16_group_statistics")
    kept, why = completed_result(info, resolve_parameters(info, {"seed": 1}, smoke=True), out / info.stem)
    assert kept is None and why == "stale: its results are from other parameters (seed: 0 → 1)"
    kept, why = completed_result(info, resolve_parameters(info, {}, smoke=True), out / info.stem)
    assert kept is not None and why == ""


def test_resume_needs_the_folder_of_the_earlier_run(capsys):
    assert main(["run", "09", "--resume"]) == 2
    assert "--out DIR" in capsys.readouterr().err


def test_a_finished_kernel_is_shut_down_without_an_interrupt():
    """jupyter_client sends SIGINT before every shutdown request (ipykernel then may log "KeyboardInterrupt caught in
    kernel"); the runner's kernel manager skips it when shutting down, and still interrupts otherwise (cell timeouts)."""
    import signal

    from workbench.catalogue.batch import ipc_kernel_manager

    manager = ipc_kernel_manager()(kernel_name="python3")
    sent = []

    async def record(signum):
        sent.append(signum)

    manager._async_signal_kernel = record
    manager.start_kernel()
    try:
        manager.interrupt_kernel()
        assert sent == [signal.SIGINT]
    finally:
        manager.shutdown_kernel()
    assert sent == [signal.SIGINT] and not manager.is_alive()


def test_a_relative_out_folder_reaches_the_notebook_as_its_working_folder(tmp_path, monkeypatch):
    """``--out runs/mine`` (as the README writes it): the kernel runs inside the notebook's own folder (resolved), and
    the notebook gets ``out_dir = "."`` — its outputs land there, not in runs/mine/<nb>/runs/mine/<nb>/, and the
    executed notebook names no folder of the machine (papermill's recorded paths cut to file names)."""
    import papermill

    from workbench.catalogue.batch import execute

    calls = {}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: calls.update(kwargs))
    info = find_notebook("00_quickstart")
    execute(info, {}, Path("runs/mine") / info.stem, render_html=False)
    written = nbformat.read(str(tmp_path / "runs" / "mine" / info.stem / f"{info.stem}.ipynb"), as_version=4)
    injected = next(c for c in written.cells if "injected-parameters" in c.metadata.get("tags", []))
    assert 'out_dir = "."' in injected.source or "out_dir = '.'" in injected.source, injected.source
    assert calls["cwd"] == str(tmp_path / "runs" / "mine" / info.stem)
    assert str(tmp_path) not in nbformat.writes(written)
