"""The watch sees a rollout drawn by an inference engine (``workbench.engines.EngineSampler``) like the sampler's, and
flags an engine that returns log-probs before temperature at τ ≠ 1 (P6) or holds another dtype (P12). The engine's
answers are canned here (``generate`` replaced), so the rollout contract is checked without vLLM."""

import pytest
import torch

from workbench.engines.sampler import EngineOptions, EngineSampler
from workbench.modeling.tiny import tiny_model
from workbench.watch.watcher import watch


def canned_engine(mode: str, dtype: str = "float32", tokens=((5, 2, 7), (6, 8, 9))) -> EngineSampler:
    engine = EngineSampler(EngineOptions(logprobs_mode=mode))
    engine.info = {"vllm": "0.32.0", "dtype": dtype}

    def generate(prompts, **kwargs):
        rows = [list(tokens[i % len(tokens)]) for i in range(len(prompts))]
        return {"tokens": rows, "logprobs": [[-0.5] * len(r) for r in rows], "finish": ["stop"] * len(rows),
                "cached": [0] * len(rows), "seconds": 0.0}

    engine.generate = generate
    return engine


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", hidden_size=96, num_attention_heads=3, num_key_value_heads=1)


def prompts(tokenizer):
    ids = torch.tensor([[tokenizer.pad_token_id, 10, 11], [12, 13, 14]])
    return ids, (ids != tokenizer.pad_token_id).long()


def test_engine_rollout_follows_the_sampler_contract(model):
    _, tokenizer = model
    ids, mask = prompts(tokenizer)
    rollout = canned_engine("processed_logprobs").sample(ids, mask, max_new_tokens=3, eos_token_id=2, pad_token_id=0)
    assert rollout.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]  # cut after the first stop id, EOS kept
    assert rollout.response_ids[0].tolist() == [5, 2, 0]
    assert rollout.finished.tolist() == [True, False]
    assert rollout.rollout_logprobs[0].tolist() == [-0.5, -0.5, 0.0]


@pytest.mark.parametrize("mode, temperature, flagged", [("raw_logprobs", 0.7, True), ("processed_logprobs", 0.7, False),
                                                        ("raw_logprobs", 1.0, False)])
def test_watch_flags_raw_logprobs_at_temperature(model, mode, temperature, flagged):
    policy, tokenizer = model
    ids, mask = prompts(tokenizer)
    with watch(policy, tokenizer=tokenizer) as watcher:
        canned_engine(mode).sample(ids, mask, max_new_tokens=3, eos_token_id=2, pad_token_id=0, temperature=temperature)
    report = watcher.report()
    assert report.observed["sampler_calls"] == 1
    assert ("P6" in report.pitfalls()) is flagged
    if flagged:
        finding = next(f for f in report.findings if f.pitfall == "P6")
        assert "processed_logprobs" in finding.message and finding.evidence["temperature"] == 0.7


def test_watch_flags_an_engine_of_another_dtype_when_the_policy_trains(model):
    policy, tokenizer = model
    ids, mask = prompts(tokenizer)
    with watch(policy, tokenizer=tokenizer) as watcher:
        rollout = canned_engine("processed_logprobs", dtype="bfloat16").sample(ids, mask, max_new_tokens=3, eos_token_id=2,
                                                                               pad_token_id=0)
        full = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
        policy.train()
        policy(input_ids=full, attention_mask=torch.ones_like(full)).logits.sum().backward()
        policy.eval()
    finding = next(f for f in watcher.report().findings if f.pitfall == "P12")
    assert finding.evidence["sampler_dtype"] == "bfloat16" and finding.evidence["engine"] == "vllm"
