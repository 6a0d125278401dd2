"""core.progress: bars hidden when asked, and step counts from worker processes summed."""

import pytest

from workbench.core import progress


@pytest.fixture(autouse=True)
def restore():
    shown = progress.bars_shown()
    yield
    progress.show_bars(shown)


def test_hidden_bars_write_nothing(capsys):
    progress.show_bars(False)
    with progress.bar(3, "hidden") as bar:
        bar.update(3)
    assert list(progress.track([1, 2], "hidden")) == [1, 2]
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_shown_bars_count_and_say_the_time_left(capsys):
    progress.show_bars(True)
    assert list(progress.track(["a", "b", "c"], "runs")) == ["a", "b", "c"]
    err = capsys.readouterr().err
    assert "runs" in err and "3/3" in err and "<" in err  # tqdm's "elapsed<remaining"


def test_step_files_sum_the_runs_and_ignore_missing_ones():
    files = progress.StepFiles(3)
    try:
        assert files.done() == 0
        progress.StepFiles.report(files.paths[0], 4)
        progress.StepFiles.report(files.paths[2], 2)
        progress.StepFiles.report(files.paths[0], 5)
        assert files.done() == 7
    finally:
        files.close()


def test_hidden_bars_inside_the_block_only(capsys):
    progress.show_bars(True)
    with progress.hidden():
        assert not progress.bars_shown()
        list(progress.track([1, 2], "inside"))
    assert progress.bars_shown()
    assert "inside" not in capsys.readouterr().err
