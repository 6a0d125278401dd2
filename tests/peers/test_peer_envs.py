"""Peer environments and the JSON exchange, without creating any environment (fast)."""

import json
import sys

import pytest
import torch

from workbench.peers import envs, protocol
from workbench.peers import invoke as runner


def test_every_spec_pins_torch_in_every_pip_call_and_as_a_constraint():
    for spec in envs.SPECS.values():
        cmds = envs.install_commands(spec, "/x/bin/python", "/x/constraints.txt")
        assert all(cmd[cmd.index("-c") + 1] == "/x/constraints.txt" for cmd in cmds)
        assert envs.TORCH_PIN in cmds[0]
        assert not any(r.split("=")[0].strip() == "torch" for r in spec.requirements), "torch is pinned by envs itself"
        # peers whose declared dependencies pull CUDA packages are installed without them
        assert all("--no-deps" in cmd for cmd in cmds[1:])
        assert all("==" in r or r == "packaging" for r in spec.requirements + spec.no_deps + spec.no_build_isolation)


def test_openrlhf_and_verl_are_installed_without_their_declared_dependencies():
    assert envs.SPECS["openrlhf-0.11.2"].no_deps == ("openrlhf==0.11.2",)
    assert envs.SPECS["verl-0.9.1"].no_deps == ("verl==0.9.1",)
    assert "flash_attn" in envs.SPECS["openrlhf-0.11.2"].standins


def test_locate_reports_a_missing_environment_with_the_fix(tmp_path):
    status = envs.locate(envs.SPECS["trl-0.15.2"], tmp_path)
    assert not status.ready and status.python is None
    assert "does not exist" in status.reason and "make peers" in status.reason


def test_locate_needs_a_stamp_with_the_same_pins(tmp_path):
    spec = envs.SPECS["transformers-4.41.2"]
    path = envs.env_dir(spec, tmp_path)
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").write_text("")
    assert "no stamp.json" in envs.locate(spec, tmp_path).reason
    (path / envs.STAMP).write_text(json.dumps({"pins": {**spec.pins(), "requirements": ["transformers==4.40.0"]}}))
    assert "other pins" in envs.locate(spec, tmp_path).reason
    (path / envs.STAMP).write_text(json.dumps({"pins": spec.pins(), "freeze": []}))
    status = envs.locate(spec, tmp_path)
    assert status.ready and status.python == str(path / "bin" / "python")


def test_a_failed_creation_is_soft_and_leaves_its_reason(tmp_path, monkeypatch):
    spec = envs.EnvSpec("nopeer", "0.0", ("this-package-does-not-exist==0.0.0",))
    monkeypatch.setattr(sys, "_base_executable", str(tmp_path / "no-such-python"), raising=False)
    status = envs.create(spec, tmp_path, log=lambda m: None)
    assert not status.ready and "no-such-python" in status.reason
    assert not envs.env_dir(spec, tmp_path).exists()
    assert "no-such-python" in envs.locate(spec, tmp_path).reason  # the .failed file explains the skip


def test_unknown_environment_names_are_a_clear_error():
    with pytest.raises(ValueError, match="known:"):
        envs.get_spec("trl-9.9")
    assert envs.main(["trl-9.9"]) == 2


def test_runner_skips_a_missing_environment_with_the_reason(tmp_path):
    payload = runner.run("verl-0.9.1", "verl", {}, root=tmp_path)
    assert payload["status"] == "skipped" and "does not exist" in payload["reason"] and payload["rows"] == []


def test_runner_reads_the_marked_json_line_after_peer_chatter():
    stdout = "some warning\n" + protocol.MARKER + json.dumps({"status": "ok", "rows": [1]}) + "\ntrailing\n"
    assert runner.parse_output(stdout) == {"status": "ok", "rows": [1]}
    assert runner.parse_output("no json here") is None


def test_an_adapter_whose_peer_cannot_be_imported_is_skipped_not_judged(tmp_path):
    """A real subprocess through the host interpreter: the adapter's import fails -> status skipped."""
    script = tmp_path / "fake_adapter.py"
    script.write_text("from workbench.peers import protocol\n"
                      "def imp():\n    import a_peer_that_is_not_installed  # noqa\n"
                      "protocol.run_adapter(imp, lambda args: [], ['a-peer'])\n")
    import subprocess

    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=runner.subprocess_env([]))
    payload = runner.parse_output(proc.stdout)
    assert payload["status"] == "skipped" and "a_peer_that_is_not_installed" in payload["reason"]


def test_json_exchange_keeps_numbers_and_marks_non_finite():
    assert protocol.jsonable({"a": torch.tensor([1.5, float("inf")]), "b": (1, 2)}) == {"a": [1.5, "inf"], "b": [1, 2]}


def test_k3_inverse_and_grpo_inputs_reproduce_arbitrary_token_losses():
    y = torch.tensor([0.0, 1e-6, 0.3, 2.0, 9.0])
    d = protocol.k3_inverse(y)
    assert torch.allclose(torch.expm1(d) - d, y.double(), atol=1e-12)
    losses = torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0]])
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    advantages, ref = protocol.grpo_inputs_for_token_losses(losses, logps, beta=0.5)
    diff = (ref - logps).double()
    rebuilt = -advantages[:, None].double() + 0.5 * (torch.exp(diff) - diff - 1)
    assert torch.allclose(rebuilt, losses.double(), atol=1e-6)
    assert advantages.tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="constant along each row"):
        protocol.grpo_inputs_for_token_losses(losses, logps, beta=0.0)


def test_the_flash_attn_stand_in_matches_sdpa_exactly():
    sys.path.insert(0, str(envs.STANDINS))
    try:
        import flash_attn
        from flash_attn.bert_padding import pad_input, unpad_input
    finally:
        sys.path.remove(str(envs.STANDINS))
    assert flash_attn.STANDIN is True
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, 8, generator=g) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]  # grouped-query attention: 4 query heads, 2 kv heads
    out = flash_attn.flash_attn_func(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2), v.repeat_interleave(2, 2).transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    flat, indices, cu, max_len, _ = unpad_input(q, mask)
    assert cu.tolist() == [0, 3, 8] and max_len == 5
    varlen = flash_attn.flash_attn_varlen_func(flat, flat[:, :2], flat[:, :2], cu, cu, 5, 5, causal=True)
    row0 = flash_attn.flash_attn_func(q[:1, :3], q[:1, :3, :2], q[:1, :3, :2], causal=True)
    assert torch.allclose(varlen[:3], row0[0], atol=1e-6)
    assert torch.equal(pad_input(flat, indices, 2, 5)[mask.bool()], q[mask.bool()])
