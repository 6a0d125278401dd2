"""``workbench.watch`` on the workbench's own trainers: every pitfall switch flagged with its id when on, no
finding of error severity with the switch at its fix; a user-style trainer's planted bugs found from one
``with`` line; the report's JSON schema; and the core staying torch + standard library only."""

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench import watch
from workbench.core.batching import position_ids_from_mask
from workbench.core.sampling_filters import filter_logits
from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.modeling.tiny import tiny_model
from workbench.tasks import Problem
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer
from workbench.watch.report import Report

ROOT = Path(__file__).resolve().parents[2]
RAGGED = [Problem("1+2=", "3"), Problem("12+34=", "46"), Problem("3*4=", "12"), Problem("56-7=", "49"),
          Problem("9-99=", "-90"), Problem("7+8=", "15"), Problem("80-80=", "0"), Problem("2*2=", "4")]
PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+34=", "chosen": "46", "rejected": "406"},
         {"prompt": "3*4=", "chosen": "12", "rejected": "7"}, {"prompt": "56-7=", "chosen": "49", "rejected": "-1"}]
DROPOUT = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}

# pitfall id → (trainer, model, the switch at its bug value, extra settings both runs share, deep mode)
SWITCHES = {
    "S1": ("grpo", "tiny-gpt2", {"position_ids": "model"}, {}, False),
    "S3": ("grpo", "tiny-arith-gpt2", {"stop_at_eos": False}, {"max_new_tokens": 12}, False),
    "P6": ("grpo", "tiny-arith-qwen2", {"rescale_by_temperature": False}, {"temperature": 0.7}, True),
    "P7": ("grpo", "tiny-gpt2-dropout", {"disable_dropout": False}, {}, False),
    "S4": ("dpo", "tiny-gpt2", {"prompt_mask": "chosen_only"}, {"share_prompts": False}, True),
    "P12": ("ppo", "tiny-arith-gpt2", {"old_logprobs": "rollout", "sampler_precision": "bf16"}, {}, False),
    "P23": ("grpo", "tiny-gpt2", {"precision": "bf16"}, {}, False),
}


def model_of(name: str):
    if name == "tiny-gpt2-dropout":
        return tiny_model("gpt2", seed=1, **DROPOUT)
    if name == "tiny-gpt2":
        return tiny_model("gpt2", seed=1)
    return load(name)


def watched_step(kind: str, name: str, switches: dict, deep: bool, prompts: int = 4, problems=RAGGED):
    model, tokenizer = model_of(name)
    if kind == "dpo":
        trainer = DPOTrainer(model, tokenizer, PAIRS, DPOConfig(**{"steps": 1, "progress": False, "batch_size": 4, **switches}))
    elif kind == "ppo":
        trainer = PPOTrainer(model, tokenizer, problems, PPOConfig(**{"steps": 1, "progress": False, "prompts_per_step": 4,
                                                                     "max_new_tokens": 6, **switches}))
    else:
        trainer = GRPOTrainer(model, tokenizer, problems, GRPOConfig(**{"steps": 1, "progress": False, "prompts_per_step": prompts,
                                                                       "num_generations": 4, "max_new_tokens": 6, **switches}))
    optimizer = getattr(trainer, "optimizer", None) or trainer.policy_optimizer
    with watch(model, tokenizer=tokenizer, optimizer=optimizer, deep=deep) as watcher:
        trainer.train()
    return watcher.report()


@pytest.mark.parametrize("pitfall", sorted(SWITCHES))
def test_switch_on_is_flagged_with_its_id(pitfall):
    kind, name, bug, shared, deep = SWITCHES[pitfall]
    report = watched_step(kind, name, {**shared, **bug}, deep)
    assert pitfall in report.pitfalls(), str(report)
    finding = next(found for found in report.findings if found.pitfall == pitfall)
    assert finding.evidence and ":" in finding.where, finding


# the fix runs share configurations (GRPO's defaults three times): two in the default suite, the rest under -m slow
FIX_RUNS = [pitfall if pitfall in ("S1", "S4") else pytest.param(pitfall, marks=pytest.mark.slow) for pitfall in sorted(SWITCHES)]


@pytest.mark.parametrize("pitfall", FIX_RUNS)
def test_switch_at_its_fix_has_no_error(pitfall):
    kind, name, _, shared, deep = SWITCHES[pitfall]
    report = watched_step(kind, name, shared, deep)
    assert not report.errors, str(report)
    assert report.observed["forwards"] > 0


def test_s1_is_a_warning_only_on_a_rotary_model():
    report = watched_step("grpo", "tiny-arith-qwen2", {"position_ids": "model"}, False)
    s1 = [finding for finding in report.findings if finding.pitfall == "S1"]
    assert s1 and all(finding.severity == "warning" for finding in s1) and "fp32 hides" in s1[0].message


def test_p7_is_a_warning_when_dropout_is_zero():
    report = watched_step("grpo", "tiny-arith-qwen2", {"disable_dropout": False}, False)
    p7 = [finding for finding in report.findings if finding.pitfall == "P7"]
    assert p7 and all(finding.severity == "warning" for finding in p7) and "harmless here" in p7[0].message


@pytest.mark.parametrize("filtered_loss", [False, True])
def test_p14_full_softmax_under_a_top_k_sampler(filtered_loss):
    """Sampled with top_k = 5; the loss differentiates the full softmax (bug) or the same filtered one (fix)."""
    model, tokenizer = load("tiny-arith-qwen2")
    prompts = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 7]]).repeat_interleave(4, 0)
    mask = (torch.arange(5) >= torch.tensor([2, 0]).repeat_interleave(4)[:, None]).long()
    with watch(model, tokenizer=tokenizer, deep=True) as watcher:
        rollout = sample(model, prompts, mask, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0))
        ids, full_mask = rollout.sequences()
        logits = model(input_ids=ids, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits[:, 4:-1].float()
        if filtered_loss:
            logits = filter_logits(logits, top_k=5, top_p=1.0)
        logp = logits.log_softmax(-1).gather(-1, rollout.response_ids[..., None])[..., 0]
        advantage = torch.linspace(-1, 1, ids.shape[0])[:, None]
        (-(advantage * logp * rollout.response_mask).sum()).backward()
    assert ("P14" in watcher.report().pitfalls()) is not filtered_loss, str(watcher.report())


def test_user_style_trainer_findings_match_its_planted_bugs():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from watch_user_trainer import PLANTED, LittleGRPO, tiny_gpt2_with_dropout
    finally:
        sys.path.remove(str(ROOT / "examples"))
    for buggy in (True, False):
        torch.manual_seed(0)
        model, tokenizer = tiny_gpt2_with_dropout()
        trainer = LittleGRPO(model, tokenizer, buggy=buggy)
        with watch(model, tokenizer=tokenizer, deep=True) as watcher:
            trainer.step({"prompts": ["1+2=", "12+34="], "n": 4})
        found = watcher.report().pitfalls("error")
        assert found == (set(PLANTED) if buggy else set()), str(watcher.report())


def test_report_schema_is_json_safe_and_names_what_to_audit():
    report = watched_step("grpo", "tiny-gpt2", {"position_ids": "model"}, False)
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"findings", "observed", "not_observable", "cost"}
    assert set(data["findings"][0]) == {"pitfall", "severity", "message", "evidence", "where"}
    checks = {entry["pitfall"]: entry["check"] for entry in data["not_observable"]}
    assert checks == {"S5": "check_aggregation", "P10": "check_grad_accumulation"}
    assert "S1" in report.html() and "S1" in str(report)


@pytest.mark.parametrize("deep", [False, True])
def test_the_report_says_what_watching_cost(deep):
    report = watched_step("grpo", "tiny-gpt2", {}, deep)
    cost = report.cost
    assert cost["mode"] == ("deep" if deep else "light")
    assert 0 < cost["watch_seconds"] < cost["watched_seconds"]  # the hooks ran, and inside the block
    line = report.cost_line()
    assert line.startswith(f"watch cost ({cost['mode']}): ") and line in str(report) and "%" in line
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))).cost == cost
    merged = Report.merge([report, report])
    assert merged.cost["watch_seconds"] == 2 * cost["watch_seconds"] and merged.cost["mode"] == cost["mode"]
    other = Report(cost={**cost, "mode": "light" if deep else "deep"})
    assert Report.merge([report, other]).cost["mode"] == "deep+light"


def test_calls_after_the_block_do_not_count_as_its_cost():
    model, tokenizer = tiny_model("gpt2", seed=1)
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long))
    spent = watcher.report().cost["watch_seconds"]
    assert spent > 0
    watcher._pre("policy", model, model, (), {"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.ones(1, 2)})
    assert watcher.report().cost["watch_seconds"] == spent


def test_hooks_are_removed_after_the_block():
    model, tokenizer = tiny_model("gpt2", seed=1)
    with watch(model, tokenizer=tokenizer) as watcher:
        pass
    ids = torch.tensor([[0, 5, 6]])
    model(input_ids=ids, attention_mask=torch.tensor([[0, 1, 1]]))
    assert watcher.report().observed["forwards"] == 0 and "generate" not in model.__dict__


def test_importing_the_watch_loads_no_transformers():
    code = "import sys, workbench.watch; print(sorted(name for name in sys.modules if name.split('.')[0] == 'transformers'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_no_padding_no_s1():
    """position_ids="model" on prompts of one length: no pads, so the positions are right and nothing is flagged."""
    same_length = [Problem("1+2=", "3"), Problem("3*4=", "12"), Problem("7+8=", "15"), Problem("2*2=", "4")]
    report = watched_step("grpo", "tiny-gpt2", {"position_ids": "model"}, False, problems=same_length)
    assert "S1" not in report.pitfalls() and report.observed["training_forwards"] > 0, str(report)


REALISTIC = ["realistic-gpt2", "realistic-qwen2", "realistic-llama"]
# RAGGED is ragged for the tiny character-level tokenizers, but the realistic BPE tokenizers of gpt2 and llama
# encode seven of its eight prompts ("12", "34", "-90" are single tokens) to one length: a step that did not pick
# "80-80=" had no padding at all, so no S1 to see. These prompts differ in length under all three tokenizers.
RAGGED_BPE = [Problem("1+2=", "3"), Problem("567-89=", "478"), Problem("9-999=", "-990"), Problem("8000-8000=", "0"),
              Problem("123456+7=", "123463"), Problem("1+1+1+1=", "4"), Problem("1234+5678=", "6912"), Problem("3*4=", "12")]


@pytest.mark.slow
@pytest.mark.parametrize("name", REALISTIC)
@pytest.mark.parametrize("pitfall", ["S1", "P7", "S4", "P23"])
def test_switches_on_realistic_checkpoints(name, pitfall):
    kind, _, bug, shared, deep = SWITCHES[pitfall]
    run = functools.partial(watched_step, kind, name, deep=deep, prompts=8, problems=RAGGED_BPE)
    on, fixed = run({**shared, **bug}), run(shared)
    assert not fixed.errors, str(fixed)
    assert pitfall in on.pitfalls(), str(on)
    if pitfall == "S1":
        s1 = [finding for finding in on.findings if finding.pitfall == "S1"]
        assert {finding.severity for finding in s1} == ({"error"} if name.endswith("gpt2") else {"warning"})
        assert all(finding.evidence["left_padded_rows"] > 0 for finding in s1)


def _causal_sdpa_as_flash(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal sdpa in a flash back-end's calling convention (output (B, T, heads, d)): lets a CPU run a model whose config
    names flash_attention_4, so the watch sees the calls it would see on a GPU. The mask is ignored (no padding is run)."""
    groups = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1),
                                                           is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _flash_4_named(monkeypatch, **overrides):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from workbench.core import attention_backward

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flash_attention_4", _causal_sdpa_as_flash)
    # the release and GPU generation of the measurement (flash-attn-4 4.0.0b36 on an H100), as on that machine
    monkeypatch.setattr(attention_backward, "installed_release", lambda implementation: "4.0.0b36")
    monkeypatch.setattr(attention_backward, "device_capability", lambda model: "9.0")
    model, tokenizer = tiny_model("qwen2", seed=0, **overrides)
    model.config._attn_implementation = "flash_attention_4"
    return model, tokenizer


@pytest.fixture
def flash_4_named(monkeypatch):
    return _flash_4_named(monkeypatch)  # head dim 16: measured wrong


def _s2(report):
    return [finding for finding in report.findings if finding.pitfall == "S2"]


def test_training_through_flash_attention_4_at_a_head_dim_measured_wrong_is_flagged_with_the_measurement(flash_4_named):
    model, tokenizer = flash_4_named
    ids = torch.randint(4, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with watch(model, tokenizer=tokenizer) as watcher:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=padded)  # scoring: no gradient, nothing to flag
    assert _s2(watcher.report()) == []
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=ids, attention_mask=torch.ones_like(ids))  # unpadded: the dense kernel's dq is wrong at 16 too
    (finding,) = _s2(watcher.report())
    assert finding.evidence["rows"] == 3 and finding.evidence["padded_rows"] == 0 and "3 unpadded row(s)" in finding.message
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=ids, attention_mask=padded)
    (finding,) = _s2(watcher.report())
    assert finding.severity == "error" and finding.evidence["padded_rows"] == 1
    for part in ("flash_attention_4", "head dim 16 ", "measured wrong", "docs/GPU.md", "sdpa"):
        assert part in finding.message
    row = torch.randint(4, 50, (1, 7), generator=torch.Generator().manual_seed(1))
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=row, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2, 3]]))  # two sequences packed into one row
    (finding,) = _s2(watcher.report())
    assert finding.evidence["packed_rows"] == 1 and finding.evidence["padded_rows"] == 0
    rows = torch.randint(4, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    with watch(model, tokenizer=tokenizer) as watcher:  # bin-packed rows: one holds two sequences, the other one
        model(input_ids=rows, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6]]))
    (finding,) = _s2(watcher.report())
    assert finding.evidence["packed_rows"] == 1 and "1 packed row(s) and 1 unpadded row(s)" in finding.message


def test_training_through_flash_attention_4_at_a_head_dim_measured_right_is_not_flagged(monkeypatch):
    model, tokenizer = _flash_4_named(monkeypatch, hidden_size=256)  # head dim 64
    ids = torch.randint(4, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=ids, attention_mask=padded)
    assert _s2(watcher.report()) == []


def test_the_same_padded_training_forward_under_sdpa_is_not_flagged():
    model, tokenizer = tiny_model("qwen2", seed=0)
    ids = torch.randint(4, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=ids, attention_mask=padded, position_ids=position_ids_from_mask(padded))
    assert _s2(watcher.report()) == []
