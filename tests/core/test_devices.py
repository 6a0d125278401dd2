"""``core.devices``: what a device name may ask for on this machine, with the fix in the error."""

import pytest
import torch

from workbench.core.devices import device_problem, resolve_device
from workbench.core.errors import ModelLoadError


def test_auto_and_cpu_are_always_fine():
    assert device_problem("auto") is None and device_problem("cpu") is None
    assert resolve_device("cpu") == torch.device("cpu")


def test_a_name_torch_does_not_know_is_a_clear_error():
    # not torch's own RuntimeError ("Expected one of cpu, cuda, ipu, …"), a traceback and exit 1 from `workbench train`
    with pytest.raises(ModelLoadError, match=r"device='tpu' is not a device name; use 'auto', 'cpu', 'cuda' or 'cuda:N'"):
        resolve_device("tpu")


def test_cuda_where_there_is_none_or_an_index_beyond_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU" in device_problem("cuda")[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device_problem("cuda") is None and device_problem("cuda:0") is None
    assert "has 1 CUDA GPU(s)" in device_problem("cuda:3")[0] and "has 1 CUDA GPU(s)" in device_problem(3)[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU" in device_problem(0)[0]  # torch's index shorthand: read as cuda:0, not as an unknown name
