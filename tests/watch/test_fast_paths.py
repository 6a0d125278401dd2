"""``workbench.watch`` on a model that takes the workbench's fast paths (the sampler's static-cache decoder,
``modeling.decode``; the inline training body, ``modeling.inline_body``): the fast paths keep running under the
watch (its hooks are covered through ``core.observers``: the paths report their calls instead of falling back to
``model(...)``), a hook that is not the watch's still sends them to ``model(...)``, and every pitfall the watch
flags on such a model is flagged with the same evidence, counters and call-site file as when the same run goes
through ``model(...)`` (the fast paths switched off)."""

from pathlib import Path

import pytest
import torch

from workbench import watch
from workbench.core import observers
from workbench.experiments.checkpoints import load
from workbench.modeling import decode, inline_body, rollout
from workbench.modeling.rollout import sample
from workbench.tasks import Problem
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer

MODEL = "tiny-arith-qwen2"  # Qwen2 under sdpa: both fast paths apply
RAGGED = [Problem("1+2=", "3"), Problem("12+34=", "46"), Problem("3*4=", "12"), Problem("56-7=", "49"),
          Problem("9-99=", "-90"), Problem("7+8=", "15"), Problem("80-80=", "0"), Problem("2*2=", "4")]
PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+34=", "chosen": "46", "rejected": "406"},
         {"prompt": "3*4=", "chosen": "12", "rejected": "7"}, {"prompt": "56-7=", "chosen": "49", "rejected": "-1"}]

# name → (trainer, switches, deep mode, the pitfall and severity it must show or None, the fast paths it must take)
RUNS = {
    "S3": ("grpo", {"stop_at_eos": False, "max_new_tokens": 12}, False, ("S3", "error"), {"decoder", "body"}),
    "P6": ("grpo", {"rescale_by_temperature": False, "temperature": 0.7}, True, ("P6", "error"), {"decoder", "body"}),
    "P7": ("grpo", {"disable_dropout": False}, False, ("P7", "warning"), {"decoder"}),  # train mode: the body is model.model
    # the bf16 rollout copy (not watched) samples through the decoder: its events are not the policy's
    "P12": ("ppo", {"old_logprobs": "rollout", "sampler_precision": "bf16"}, False, ("P12", "warning"), {"decoder"}),
    "P23": ("grpo", {"precision": "bf16"}, False, ("P23", "error"), {"decoder", "body"}),
    "S1": ("grpo", {"position_ids": "model"}, False, ("S1", "warning"), {"decoder"}),  # the scorer calls model(...) here
    "grpo-fix": ("grpo", {}, True, None, {"decoder", "body"}),
    "dpo-fix": ("dpo", {}, True, None, {"body"}),  # policy and reference through the inline body
}


@pytest.fixture
def fast_calls(monkeypatch):
    """Counts of the fast paths' computations (the decoder's prefills and steps, the inline body's forwards)."""
    calls = {"decoder": 0, "body": 0}

    def counted(name, original):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(decode.StaticDecoder, "_step", counted("decoder", decode.StaticDecoder._step))
    monkeypatch.setattr(decode.StaticDecoder, "_prefill_rows", counted("decoder", decode.StaticDecoder._prefill_rows))
    monkeypatch.setattr(inline_body, "_hidden_states", counted("body", inline_body._hidden_states))
    return calls


def slow_paths(monkeypatch):
    """Every forward through model(...)/model.model(...): the path a model with foreign hooks takes."""
    monkeypatch.setattr(rollout, "unsupported_reason", lambda model: "switched off by the test")
    monkeypatch.setattr(inline_body, "usable", lambda model: False)


def watched_run(kind: str, switches: dict, deep: bool):
    model, tokenizer = load(MODEL)
    reference = None
    if kind == "dpo":
        trainer = DPOTrainer(model, tokenizer, PAIRS, DPOConfig(**{"steps": 2, "progress": False, "batch_size": 4, **switches}))
        reference = trainer.reference
    elif kind == "ppo":
        trainer = PPOTrainer(model, tokenizer, RAGGED, PPOConfig(**{"steps": 2, "progress": False, "prompts_per_step": 4,
                                                                   "max_new_tokens": 6, **switches}))
    else:
        trainer = GRPOTrainer(model, tokenizer, RAGGED, GRPOConfig(**{"steps": 2, "progress": False, "prompts_per_step": 4,
                                                                     "num_generations": 4, "max_new_tokens": 6, **switches}))
    optimizer = getattr(trainer, "optimizer", None) or trainer.policy_optimizer
    with watch(model, tokenizer=tokenizer, reference=reference, optimizer=optimizer, deep=deep) as watcher:
        trainer.train()
    return watcher.report()


def observations(report) -> tuple[list, dict]:
    """Findings as (pitfall, severity, call-site file, evidence), sorted; the counters. The call site's line differs
    between the paths (the line that called the fast path vs the line that called model(...)), its file does not."""
    findings = sorted(((finding.pitfall, finding.severity, Path(finding.where.rsplit(":", 1)[0]).name, finding.evidence)
                       for finding in report.findings), key=lambda finding: finding[:3])
    return findings, dict(report.observed)


def assert_same_observations(fast, slow):
    (fast_findings, fast_counts), (slow_findings, slow_counts) = observations(fast), observations(slow)
    assert fast_counts == slow_counts
    assert [finding[:3] for finding in fast_findings] == [finding[:3] for finding in slow_findings], (fast_findings, slow_findings)
    for (*key, fast_evidence), (_, _, _, slow_evidence) in zip(fast_findings, slow_findings, strict=True):
        assert fast_evidence.keys() == slow_evidence.keys(), key
        for name, value in fast_evidence.items():
            if isinstance(value, float):  # deep mode's fits: other kernels' float noise is allowed, nothing else
                assert value == pytest.approx(slow_evidence[name], rel=1e-4, abs=1e-6), (key, name)
            else:
                assert value == slow_evidence[name], (key, name)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_same_findings_with_and_without_the_fast_paths(name, fast_calls, monkeypatch):
    kind, switches, deep, expected, paths = RUNS[name]
    fast = watched_run(kind, switches, deep)
    taken = dict(fast_calls)
    assert all(taken[path] > 0 for path in paths), taken  # the fast paths ran under the watch
    with monkeypatch.context() as m:
        slow_paths(m)
        slow = watched_run(kind, switches, deep)
    assert fast_calls == taken  # the second run went through model(...) only
    if expected is None:
        assert not fast.errors and not fast.findings, str(fast)
    else:
        assert expected in [(finding.pitfall, finding.severity) for finding in fast.findings], str(fast)
    assert fast.observed["forwards"] > 0
    assert_same_observations(fast, slow)


def test_double_bos_and_decoding_past_eos_through_the_decoder(fast_calls, monkeypatch):
    """P21 (prefill rows) and S3 (decode steps) from ``sample(static_cache=True)`` called directly."""
    model, tokenizer = load(MODEL)
    bos = tokenizer.bos_token_id
    prompts = torch.tensor([[0, bos, bos, 6, 15, 7], [bos, bos, 6, 15, 7, 19], [0, 0, bos, 6, 15, 7]]).repeat_interleave(2, 0)
    mask = (prompts != 0).long()
    reports = []
    for fast in (True, False):
        with monkeypatch.context() as m:
            if not fast:
                slow_paths(m)
            with watch(model, tokenizer=tokenizer) as watcher:
                sample(model, prompts, mask, max_new_tokens=12, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, stop_at_eos=False, generator=torch.Generator().manual_seed(0),
                       static_cache=True, share_prefill=True)
            reports.append(watcher.report())
        if fast:
            assert fast_calls["decoder"] == 12  # one prefill + 11 steps, all without model(...)
    p21 = [finding for finding in reports[0].findings if finding.pitfall == "P21"]
    assert len(p21) == 1 and p21[0].evidence["rows"] == 2 and p21[0].evidence["bos_id"] == bos, str(reports[0])  # distinct rows
    s3 = [finding for finding in reports[0].findings if finding.pitfall == "S3"]
    assert s3 and s3[0].evidence["wasted_decode_forwards"] > 0 and s3[0].where.split(":")[0].endswith("rollout.py"), str(reports[0])
    assert reports[0].observed["decode_forwards"] == 11 and reports[0].observed["no_grad_forwards"] == 12
    assert_same_observations(*reports)


def test_the_fast_paths_are_taken_while_watched_and_a_foreign_hook_still_stops_them(fast_calls):
    model, tokenizer = load(MODEL)
    assert decode.unsupported_reason(model) is None and inline_body.usable(model)
    trainer = GRPOTrainer(model, tokenizer, RAGGED, GRPOConfig(steps=1, progress=False, prompts_per_step=2, num_generations=4,
                                                                max_new_tokens=6))
    with watch(model, tokenizer=tokenizer, optimizer=trainer.optimizer) as watcher:
        hooks = [hook for module in (model, model.model) for hook in (*module._forward_pre_hooks.values(), *module._forward_hooks.values())]
        assert len(hooks) == 4 and all(observers.covered(h) for h in hooks)
        assert decode.unsupported_reason(model) is None and inline_body.usable(model)  # the watch's hooks are covered
        trainer.train_step(0)
        taken = dict(fast_calls)
        handle = model.model.layers[0].register_forward_hook(lambda *args: None)  # someone else's hook: not covered
        try:
            assert "hooks" in decode.unsupported_reason(model) and not inline_body.usable(model)
            trainer.train_step(1)
        finally:
            handle.remove()
    assert taken["decoder"] > 0 and taken["body"] == 1, taken
    assert fast_calls == taken  # step 1 (foreign hook) ran through model(...)
    observed = watcher.report().observed
    assert observed["training_forwards"] == 2 and observed["sampler_calls"] == 2  # both steps seen, whichever path
    assert not any(observers.covered(h) for h in hooks) and not observers.listening()  # detached after the block
