import pytest
import torch
from safetensors.torch import save_file

from workbench.core.errors import RunFolderInUse
from workbench.trainers.checkpointing import latest_checkpoint, load_checkpoint, run_folder_lock, save_checkpoint


def _module_and_optimizer():
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)
    module(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return module, optimizer


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    module, optimizer = _module_and_optimizer()
    generator = torch.Generator().manual_seed(7)
    torch.manual_seed(123)
    save_checkpoint(tmp_path, 5, modules={"m": module}, optimizers={"o": optimizer}, state={"history": [1]}, generators={"g": generator})
    expected_next = torch.rand(3)
    expected_gen = torch.rand(3, generator=generator)

    fresh, fresh_opt = torch.nn.Linear(3, 2), None
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    new_gen = torch.Generator()
    state = load_checkpoint(latest_checkpoint(tmp_path), modules={"m": fresh}, optimizers={"o": fresh_opt}, generators={"g": new_gen})
    assert state == {"step": 5, "history": [1]}
    assert torch.equal(fresh.weight, module.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(torch.rand(3), expected_next)
    assert torch.equal(torch.rand(3, generator=new_gen), expected_gen)


def test_an_interrupted_write_is_never_trusted(tmp_path):
    module, optimizer = _module_and_optimizer()
    save_checkpoint(tmp_path, 1, modules={"m": module}, optimizers={"o": optimizer}, state={})
    # a crash mid-write leaves a temporary folder behind: it must not become "latest"
    partial = tmp_path / "checkpoints" / ".tmp-step-000002-xyz"
    partial.mkdir()
    save_file({"weight": torch.zeros(1)}, str(partial / "m.safetensors"))
    assert latest_checkpoint(tmp_path).name == "step-000001"


def test_old_checkpoints_are_pruned(tmp_path):
    module, optimizer = _module_and_optimizer()
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, modules={"m": module}, optimizers={"o": optimizer}, state={}, keep=2)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert kept == ["step-000003", "step-000004"]


def test_unfinished_saves_are_removed_when_a_training_takes_the_folder(tmp_path, capsys):
    module, optimizer = _module_and_optimizer()
    save_checkpoint(tmp_path, 1, modules={"m": module}, optimizers={"o": optimizer}, state={})
    root = tmp_path / "checkpoints"
    partial = root / ".tmp-step-000002-xyz"  # a save killed before its rename
    partial.mkdir()
    save_file({"weight": torch.zeros(1)}, str(partial / "m.safetensors"))
    (root / ".latest.abc123.tmp").write_text("step-000002\n")  # a pointer update killed before its rename
    with run_folder_lock(tmp_path):
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]
    assert "removed 2 unfinished checkpoint write(s)" in capsys.readouterr().out
    assert latest_checkpoint(tmp_path).name == "step-000001"


def test_a_training_folder_held_by_another_training_is_refused_with_the_output_dir_fix(tmp_path, hold_elsewhere):
    with hold_elsewhere(tmp_path, "training"):
        with pytest.raises(RunFolderInUse, match=r"another training \(pid \d+ .*would interleave their checkpoints.*--output-dir"):
            with run_folder_lock(tmp_path):
                pass
