"""``core.attention_backward``: flash-attn 4 is trusted for training only where its gradients were measured right
(release, GPU generation, head dim — docs/GPU.md); measured-wrong and unmeasured configurations get a reason that
says which, and the other back-ends none. The verdict is a pure function; the model-level lookup reads the head dim
from any config naming (Llama/Qwen2 ``head_dim`` or hidden/heads, GPT-2's ``n_embd``/``n_head``)."""

import pytest

from workbench.core import attention_backward as ab
from workbench.modeling.tiny import tiny_model

MEASURED = ("4.0.0b36", "9.0")  # the release and compute capability of the H100 runs


@pytest.mark.parametrize("head_dim", [8, 16, 48, 80])
def test_the_head_dims_measured_wrong_are_refused_with_the_measurement(head_dim):
    reason = ab.backward_verdict("flash_attention_4", head_dim, *MEASURED)
    assert f"head dim {head_dim} " in reason and "measured wrong" in reason and "docs/GPU.md" in reason


@pytest.mark.parametrize("head_dim", [24, 32, 64, 96, 128, 192, 256])
def test_the_head_dims_measured_right_train(head_dim):
    assert ab.backward_verdict("flash_attention_4", head_dim, *MEASURED) is None


@pytest.mark.parametrize(("head_dim", "release", "capability", "named"), [
    (64, "4.0.1", "9.0", "flash-attn-4 4.0.1"),  # another release: not assumed right
    (64, "4.0.0b36", "10.0", "compute capability 10.0"),  # Blackwell runs other kernels
    (64, None, None, "release unknown"),  # not installed here (a CPU)
    (40, "4.0.0b36", "9.0", "head dim 40 "),  # a head dim never measured
])
def test_anything_not_measured_is_unverified_and_says_what_was(head_dim, release, capability, named):
    reason = ab.backward_verdict("flash_attention_4", head_dim, release, capability)
    assert "not verified" in reason and named in reason and "4.0.0b36 on 9.0: right at 24, 32, 64" in reason
    assert "scripts/gpu_check.py --sections kernels,gradients" in reason


@pytest.mark.parametrize("implementation", ["sdpa", "eager", "flash_attention_2", ""])
def test_other_back_ends_have_no_verdict(implementation):
    assert ab.backward_verdict(implementation, 16, None, None) is None


def test_the_head_dim_is_read_from_every_config_naming():
    from transformers import GPT2Config, LlamaConfig

    assert ab.head_dim_of(tiny_model("qwen2", seed=0)[0].config) == 16  # hidden 64 / 4 heads, no head_dim field
    assert ab.head_dim_of(GPT2Config(n_embd=256, n_head=4)) == 64
    assert ab.head_dim_of(LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=32)) == 32  # explicit wins
    assert ab.head_dim_of(object()) is None


def test_a_model_is_judged_by_its_back_end_head_dim_release_and_device():
    model, _ = tiny_model("qwen2", seed=0)  # head dim 16
    assert ab.unverified_backward_reason(model) is None  # sdpa
    model.config._attn_implementation = "flash_attention_4"
    assert "measured wrong" in ab.unverified_backward_reason(model, release=MEASURED[0], capability=MEASURED[1])
    assert "not verified" in ab.unverified_backward_reason(model)  # on this CPU: no release, no GPU seen
    wide, _ = tiny_model("qwen2", seed=0, hidden_size=256)  # head dim 64
    wide.config._attn_implementation = "flash_attention_4"
    assert ab.unverified_backward_reason(wide, release=MEASURED[0], capability=MEASURED[1]) is None
    assert ab.device_capability(wide) is None  # parameters on the CPU


class _ConfigOnly:
    """A model as the check sees it: a config, parameters on the CPU."""

    def __init__(self, config):
        self.config = config

    def parameters(self):
        return iter(())


def test_each_sub_config_is_judged_by_its_own_back_end_and_head_dim():
    from transformers import Qwen2VLConfig

    config = Qwen2VLConfig(text_config=dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2),  # head dim 64
                           vision_config=dict(embed_dim=1280, num_heads=16))  # head dim 80: measured wrong
    config._attn_implementation = {"text_config": "flash_attention_4", "vision_config": "sdpa", "": "sdpa"}
    assert ab.unverified_backward_reason(_ConfigOnly(config), release=MEASURED[0], capability=MEASURED[1]) is None
    config._attn_implementation = "flash_attention_4"  # the vision tower too
    reason = ab.unverified_backward_reason(_ConfigOnly(config), release=MEASURED[0], capability=MEASURED[1])
    assert "head dim 80 " in reason and "measured wrong" in reason


def test_latent_attention_has_no_single_head_dim_and_is_unverified():
    from transformers import DeepseekV3Config

    config = DeepseekV3Config(hidden_size=256, num_attention_heads=4)
    assert ab.head_dim_of(config) is None
    assert "head dim None " in ab.backward_verdict("flash_attention_4", ab.head_dim_of(config), *MEASURED)


def test_the_capability_is_that_of_every_gpu_holding_parameters(monkeypatch):
    import torch

    class OnGpus:
        def __init__(self, *devices):
            self.devices = devices

        def parameters(self):  # stand-ins: only .device is read
            return iter(type("P", (), {"device": torch.device(d)})() for d in self.devices)

    capabilities = {0: (9, 0), 1: (10, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capabilities[device.index])
    assert ab.device_capability(OnGpus("cpu", "cuda:0", "cuda:0")) == "9.0"  # offloaded embeddings: the GPU's still
    assert ab.device_capability(OnGpus("cuda:0", "cuda:1")) is None  # two generations: unverified
    assert ab.device_capability(OnGpus("cpu")) is None
