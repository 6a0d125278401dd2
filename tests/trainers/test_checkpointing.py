import torch
from safetensors.torch import save_file

from workbench.trainers.checkpointing import latest_checkpoint, load_checkpoint, save_checkpoint


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
