"""``workbench.core.trackers``: the ``--report-to`` names, the numbers kept, a missing package's error naming the
extra, and a history logged to trackio's local store and to a W&B offline run read back equal, value for value."""

import sys

import pytest
from tracker_history import point_trackio_at, trackio_history, wandb_history

from workbench.core.errors import InputError
from workbench.core.trackers import EXTRA, check_installed, finite_scalars, open_trackers, tracker_names


def test_names_split_on_spaces_and_commas_and_drop_none_and_duplicates():
    assert tracker_names(["trackio,wandb", "none", "trackio"]) == ["trackio", "wandb"]
    assert tracker_names("none") == [] and tracker_names(None) == []
    with pytest.raises(InputError, match="'mlflow': unknown tracker; choose from tensorboard, trackio, wandb"):
        tracker_names(["mlflow"])


def test_only_finite_numbers_are_logged():
    assert finite_scalars({"loss": 0.5, "steps": 3, "nan": float("nan"), "inf": float("inf"), "ok": True,
                           "name": "x"}) == {"loss": 0.5, "steps": 3.0}


@pytest.mark.parametrize("name", ["trackio", "wandb"])
def test_a_missing_package_is_an_input_error_naming_the_extra(name, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(InputError, match=rf"--report-to {name} needs the {name} package") as error:
        check_installed(["tensorboard", name])
    assert f"pip install '{EXTRA}'" in str(error.value) and EXTRA == "rlhf-pitfalls-workbench[trackers]"


def test_tensorboard_needs_an_output_folder():
    with pytest.raises(InputError, match="give --output-dir DIR"):
        open_trackers(["tensorboard"])


HISTORY = [{"loss": 0.25, "reward": 0.5, "kl": 0.0}, {"loss": -0.125, "reward": 0.75, "kl": 1e-3, "clip": float("nan")},
           {"loss": 0.0625, "reward": 1.0, "kl": 2.5e-3}]


def test_trackio_and_wandb_offline_read_back_the_history_logged(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    pytest.importorskip("wandb")
    point_trackio_at(tmp_path / "trackio", monkeypatch)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with open_trackers(["trackio", "wandb"], output_dir=str(tmp_path / "run"), run_name="unit", project="unit",
                       config={"lr": 1e-3}) as trackers:
        for step, row in enumerate(HISTORY):
            trackers.log(row, step)
    expected = {step: finite_scalars(row) for step, row in enumerate(HISTORY)}  # the NaN dropped, not logged
    assert trackio_history("unit", "unit") == expected
    assert wandb_history(tmp_path / "run") == expected
