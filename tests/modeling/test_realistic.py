"""The small realistic checkpoints: each builds in seconds, loads with transformers, and has the
properties of its real counterpart (no pad, BOS = EOS, no BOS, two stop ids, bf16, templates)."""

import json
import subprocess
import sys
import time

import pytest
import torch

from workbench.experiments import checkpoints
from workbench.experiments.checkpoints import load
from workbench.modeling import realistic
from workbench.modeling.stop_ids import template_turn_end
from workbench.trainers import realistic_chat


@pytest.fixture(scope="module")
def loaded():
    return {flavour: checkpoints.load(realistic.checkpoint(flavour), dtype=None, device="cpu", pad_token="keep")
            for flavour in realistic.FLAVOURS}


@pytest.mark.parametrize("flavour", ["gpt2", "llama"])
def test_builds_in_seconds_with_safetensors_only(tmp_path, flavour):
    start = time.perf_counter()
    folder = realistic.write_checkpoint(flavour, tmp_path / flavour)
    assert time.perf_counter() - start < 10
    names = {p.name for p in folder.iterdir()}
    assert "model.safetensors" in names and not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    assert json.loads((folder / "realistic.json").read_text())["flavour"] == flavour


def test_gpt2_like(loaded):
    model, tokenizer = loaded["gpt2"]
    assert tokenizer.pad_token is None and tokenizer.bos_token_id == tokenizer.eos_token_id is not None
    assert tokenizer.chat_template is None
    assert model.config.model_type == "gpt2" and model.config.resid_pdrop == 0.1 == model.config.attn_pdrop
    assert 1e5 <= sum(p.numel() for p in model.parameters()) <= 1e6
    ids = tokenizer("47+8=55 the river")["input_ids"]
    assert ids[0] != tokenizer.bos_token_id  # GPT-2 adds no BOS
    assert len(ids) < len("47+8=55 the river")  # BPE merges: fewer tokens than characters


def test_qwen2_like(loaded):
    model, tokenizer = loaded["qwen2"]
    assert tokenizer.bos_token is None and tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    stop = model.generation_config.eos_token_id
    assert sorted(stop) == sorted(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config.tie_word_embeddings
    text = tokenizer.apply_chat_template([{"role": "user", "content": "2+2="}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
    assert template_turn_end(tokenizer) == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.convert_ids_to_tokens(tokenizer("47")["input_ids"]) == ["4", "7"]  # Qwen2 splits digits


def test_qwen2_loads_through_workbench_models():
    model, tokenizer = load(realistic.checkpoint("qwen2"))
    assert tokenizer.pad_token_id != tokenizer.eos_token_id and model.config.model_type == "qwen2"


def test_qwen2_base_turn_end_is_not_its_eos(loaded):
    model, tokenizer = loaded["qwen2-base"]
    turn_end = template_turn_end(tokenizer)
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id != turn_end


def test_llama_like_adds_bos_and_its_template_writes_one(loaded):
    model, tokenizer = loaded["llama"]
    bos = tokenizer.bos_token_id
    assert tokenizer.pad_token is None and bos is not None and bos != tokenizer.eos_token_id
    assert tokenizer("hello")["input_ids"][0] == bos
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|>")
    assert tokenizer(text)["input_ids"][:2] == [bos, bos]
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") in model.generation_config.eos_token_id


def test_every_flavour_runs_a_forward(loaded):
    for flavour, (model, tokenizer) in loaded.items():
        ids = torch.tensor([tokenizer("12+3=15", add_special_tokens=False)["input_ids"]])
        logits = model(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits.float()).all(), flavour


def test_unknown_flavour_is_a_clear_error():
    with pytest.raises(ValueError, match="choose one of"):
        realistic.checkpoint("mistral")
    result = subprocess.run([sys.executable, "scripts/make_realistic_checkpoints.py", "mistral"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown flavour" in result.stderr


def test_chat_sft_checkpoint_ends_its_turns():
    from workbench.core.batching import pad_sequences
    from workbench.modeling.rollout import sample

    model, tokenizer = checkpoints.load(realistic_chat.chat_checkpoint("qwen2"), dtype=None, device="cpu", pad_token="keep")
    turn_end = template_turn_end(tokenizer)
    rows = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in ("12+5=", "3*4=", "Say something.")]
    encoded = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in rows]
    ids, mask = pad_sequences(encoded, tokenizer.pad_token_id, side="left")
    rollout = sample(model, ids, mask, max_new_tokens=16, eos_token_id=turn_end, pad_token_id=tokenizer.pad_token_id, greedy=True)
    assert bool(rollout.finished.all())
