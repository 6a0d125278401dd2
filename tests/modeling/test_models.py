import json

import pytest
import torch

from workbench.core.errors import AttentionBackendUnavailable, ModelLoadError
from workbench.experiments.checkpoints import load
from workbench.modeling import attention, models, pad_policy, tiny
from workbench.modeling.tiny import tiny_model


@pytest.mark.parametrize("arch", tiny.ARCHITECTURES)
def test_tiny_model_is_small_seeded_and_trainable(arch):
    model, tokenizer = tiny_model(arch, seed=3)
    again, _ = tiny_model(arch, seed=3)
    other, _ = tiny_model(arch, seed=4)
    assert models.count_parameters(model) < 200_000
    first = next(iter(model.state_dict().values()))
    assert torch.equal(first, next(iter(again.state_dict().values())))
    assert not torch.equal(first, next(iter(other.state_dict().values())))
    ids = torch.randint(4, len(tokenizer), (16, 128))
    out = model(input_ids=ids, use_cache=False)
    out.logits.float().mean().backward()
    assert out.logits.shape == (16, 128, len(tokenizer))
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_rope_and_absolute_architectures_are_told_apart():
    assert models.uses_rope(tiny_model("llama")[0]) and models.uses_rope(tiny_model("qwen2")[0])
    assert not models.uses_rope(tiny_model("gpt2")[0])


def test_tiny_model_dtype_and_overrides():
    model, _ = tiny_model("qwen2", dtype=torch.bfloat16, hidden_size=32)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config.hidden_size == 32
    with pytest.raises(ValueError, match="no field"):
        tiny_model("qwen2", hiden_size=32)
    with pytest.raises(ValueError, match="Unknown architecture"):
        tiny_model("mamba")


def test_attention_backend_auto_falls_back_to_sdpa_and_flash_request_is_a_clear_error():
    assert attention.resolve_attn_implementation("auto") in ("sdpa", *attention.FLASH_BACKENDS)
    for backend in attention.FLASH_BACKENDS:
        available, reason = attention.flash_attention_status(backend)
        if not available:
            with pytest.raises(AttentionBackendUnavailable, match="sdpa"):
                load("tiny-qwen2", attn_implementation=backend)
    if not attention.available_flash_backends():
        assert attention.resolve_attn_implementation("auto") == "sdpa"
    with pytest.raises(ValueError, match="not one of"):
        attention.resolve_attn_implementation("flash3")


def _pretend_gpu(monkeypatch, distributions: set[str], capability: tuple[int, int]):
    monkeypatch.setattr(attention.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attention.torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(attention.torch.cuda, "get_device_name", lambda *a: "a test GPU")
    monkeypatch.setattr(attention, "_distributions_of_flash_attn", lambda: distributions)


def test_flash_attention_4_needs_its_own_distribution_and_a_hopper_gpu(monkeypatch):
    # FA2's distribution provides the same import name (flash_attn) but not FA4's kernels, and the reverse
    _pretend_gpu(monkeypatch, {"flash-attn"}, (9, 0))
    assert attention.resolve_attn_implementation("auto", torch.bfloat16) == "flash_attention_2"
    assert attention.resolve_attn_implementation("auto", torch.float32) == "sdpa"  # flash kernels have no fp32 path
    assert attention.resolve_attn_implementation("auto") == "sdpa"
    available, reason = attention.flash_attention_status("flash_attention_4")
    assert not available and "flash-attn-4 package is not installed" in reason
    _pretend_gpu(monkeypatch, {"flash-attn-4"}, (9, 0))
    # FA4 by name only: "auto" never picks a back-end whose gradients were measured wrong (core.attention_backward)
    assert attention.resolve_attn_implementation("auto", torch.float16) == "sdpa"
    assert attention.resolve_attn_implementation("flash_attention_4") == "flash_attention_4"
    _pretend_gpu(monkeypatch, {"flash-attn", "flash-attn-4"}, (9, 0))
    assert attention.resolve_attn_implementation("auto", torch.bfloat16) == "flash_attention_2"
    _pretend_gpu(monkeypatch, {"flash-attn-4"}, (9, 0))
    with pytest.raises(AttentionBackendUnavailable, match="flash-attn package is not installed"):
        attention.resolve_attn_implementation("flash_attention_2")
    _pretend_gpu(monkeypatch, {"flash-attn-4"}, (8, 0))  # an A100: FA4's kernels are Hopper/Blackwell only
    assert attention.resolve_attn_implementation("auto", torch.bfloat16) == "sdpa"
    with pytest.raises(AttentionBackendUnavailable, match=r"capability ≥ 9.0 .* has 8.0"):
        attention.resolve_attn_implementation("flash_attention_4")
    with pytest.raises(ValueError, match="not a flash back-end"):
        attention.flash_attention_status("sdpa")


@pytest.mark.parametrize("name", models.BUILTIN_NAMES)
def test_every_builtin_name_loads_offline(name):
    model, tokenizer = load(name)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.config.vocab_size == len(tokenizer)


def test_a_saved_local_folder_round_trips(tmp_path):
    model, tokenizer = tiny_model("gpt2", seed=1)
    models.save(model, tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    loaded, _ = load(tmp_path / "ckpt")
    ids = torch.tensor([[1, 5, 6, 7]])
    torch.testing.assert_close(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_missing_folder_names_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist.*built-in names"):
        load(tmp_path / "nope")


def test_pickle_only_weights_are_refused(tmp_path):
    model, tokenizer = tiny_model("gpt2")
    models.save(model, tokenizer, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelLoadError, match="only pickle weights.*safe_serialization"):
        load(tmp_path)


def test_remote_code_checkpoints_are_refused(tmp_path):
    model, tokenizer = tiny_model("gpt2")
    models.save(model, tokenizer, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        load(tmp_path)


def test_pad_equal_eos_tokenizer_is_refused_unless_opted_in(tmp_path):
    model, tokenizer = tiny_model("gpt2")
    models.save(model, tokenizer, tmp_path)
    with pytest.raises(ModelLoadError, match="pad token equals its EOS"):
        load(tmp_path, pad_token="<eos>")
    _, loaded_tokenizer = load(tmp_path, pad_token="<eos>", allow_pad_equal_eos=True)
    assert loaded_tokenizer.pad_token_id == loaded_tokenizer.eos_token_id


def test_tokenizer_without_pad_token_names_the_fix(tmp_path):
    model, tokenizer = tiny_model("gpt2")
    models.save(model, tokenizer, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    _, automatic = load(tmp_path)  # pad_token="auto": the existing, never generated <pad>
    assert automatic.pad_token == "<pad>" and automatic.pad_token_id != automatic.eos_token_id
    _, loaded = load(tmp_path, pad_token="<unk>")
    assert loaded.pad_token_id != loaded.eos_token_id
    loaded.pad_token = None
    with pytest.raises(ModelLoadError, match="no pad token.*pad_token='auto'"):
        pad_policy.check_tokenizer(loaded)


@pytest.mark.parametrize("name", ["tiny-arith-qwen2", "tiny-arith-gpt2", "tiny-sums-qwen2", "tiny-restate-qwen2"])
def test_trained_checkpoints_tokenize_like_the_shipped_tokenizer(name, tokenizer):
    """AutoTokenizer would read a qwen2 folder as Qwen2Tokenizer: spaces dropped, no lowercasing (the sums
    prompts have spaces). The loader reads the class the folder names instead."""
    text = "sum 3 5 9 = AB"
    _, loaded = load(name)
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert models.load_tokenizer(tiny.TRAINED_CHECKPOINTS[name])(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_dtype_names_and_refusals():
    """An unknown dtype name is refused here: transformers would read it as a device ("Invalid device string: 'float16x'")."""
    with pytest.raises(ModelLoadError, match=r"dtype='float16x' is not a floating torch dtype; pass torch.float32"):
        load("tiny-arith-qwen2", dtype="float16x")
    with pytest.raises(ModelLoadError, match="dtype='int8' is not a floating torch dtype"):
        load("tiny-arith-qwen2", dtype="int8")
    assert next(load("tiny-arith-qwen2", dtype="bfloat16")[0].parameters()).dtype == torch.bfloat16
    assert models._checked_dtype("auto") is None and models._checked_dtype(torch.float16) is torch.float16
