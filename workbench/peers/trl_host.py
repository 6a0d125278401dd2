"""Probes of TRL 1.16 (the optional ``peers`` extra), built on ``workbench.audit``.

Each probe wraps one of TRL's own methods into the callable an audit check expects and lets the
check classify it; none reads TRL's source. Everything runs on CPU with a local model folder
(``use_cpu=True, bf16=False, report_to="none"``, ``HF_HUB_OFFLINE=1``). The same wrappers run inside
older TRL releases in the peer lab (``workbench.peers.adapters.trl_grpo``), so TRL 1.16 here and
TRL 0.15/0.16 there are measured by one piece of code.

* ``probe_grpo_aggregation``: ``check_aggregation`` on TRL's GRPO loss for each ``loss_type`` (β = 1 and
  ratio 1, advantages and reference log-probs chosen so that TRL's per-token losses are the check's);
* ``probe_position_ids``: ``check_position_ids`` on TRL's GRPO log-prob forward (S1);
* ``probe_dpo``: whether TRL's DPO log-probs leave prompt tokens out on both sides (S4), and
  whether its reference is the live initial policy or reloaded from disk;
* ``probe_eos``: decoding steps TRL's GRPO generation takes vs what the completions needed (S3).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from workbench.audit import AuditResult, check_aggregation, check_position_ids
from workbench.core.paths import scratch_folder
from workbench.modeling.models import save
from workbench.peers.adapters import trl_grpo
from workbench.trainers.preferences import build_loss_mask, collate_preferences, summed_logprobs

TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def trl_available() -> tuple[bool, str]:
    try:
        import trl

        return True, f"trl {trl.__version__}"
    except ImportError:
        return False, "TRL is not installed (pip install -e '.[peers]')"


def _cpu_args(config_cls, **overrides):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return config_cls(output_dir=scratch_folder("trl-probe-"), use_cpu=True, bf16=False, report_to="none",
                      logging_steps=1, max_steps=1, **overrides)


def model_folder(model, tokenizer) -> str:
    """Save a model to a temporary local checkpoint folder (what TRL loads)."""
    return str(save(model, tokenizer, Path(scratch_folder("trl-model-"))))


def grpo_trainer(folder: str, tokenizer, **config):
    from datasets import Dataset  # datasets: peer environments only (TRL's)
    from trl import GRPOConfig, GRPOTrainer  # trl: peer environments only

    config = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8, "beta": 0.0, **config}
    trainer = GRPOTrainer(
        model=folder, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=_cpu_args(GRPOConfig, **config),
        train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 8), processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def grpo_loss_fn(trainer, tokenizer, beta: float = 1.0):
    """TRL's own GRPO loss as ``loss_fn(per_token_loss, mask) -> scalar`` (the audit signature)."""
    return lambda per_token_loss, mask: trl_grpo.trainer_loss(trainer, tokenizer, per_token_loss, mask, beta)


def probe_grpo_aggregation(folder: str, tokenizer, loss_types=TRL_LOSS_TYPES) -> dict[str, AuditResult]:
    """``check_aggregation`` of TRL's loss for each ``loss_type`` (``details["mode"]``: the verl name)."""
    results = {}
    for loss_type in loss_types:
        trainer = grpo_trainer(folder, tokenizer, loss_type=loss_type, beta=1.0)
        trainer.model.eval()
        results[loss_type] = check_aggregation(grpo_loss_fn(trainer, tokenizer), expected=loss_type)
    return results


def probe_position_ids(folder: str, tokenizer) -> AuditResult:
    """``check_position_ids`` on TRL's GRPO log-prob forward (fails = S1 exposure on absolute positions)."""
    trainer = grpo_trainer(folder, tokenizer)
    trainer.model.eval()

    def logprob_fn(model, input_ids, attention_mask):
        return trl_grpo.per_token_logps(trainer, input_ids, attention_mask, input_ids.shape[1] - 1)

    with torch.no_grad():
        return check_position_ids(logprob_fn, trainer.model, tokenizer)


def probe_eos(folder: str, tokenizer, prompts=("1+2=", "12+34=", "5*5=", "99-9="), max_completion_length: int = 32) -> dict:
    """Forward passes (= tokens per row) of TRL's generation vs the longest completion up to EOS."""
    trainer = grpo_trainer(folder, tokenizer, max_completion_length=max_completion_length)
    steps = {"n": 0}

    def count(module, args, kwargs):  # every forward of generate() yields one token per row
        steps["n"] += 1

    handle = trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with torch.no_grad():
            _, completion_ids, *_ = trainer._generate([{"prompt": p}["prompt"] for p in prompts])
    finally:
        handle.remove()
    needed = []
    for ids in completion_ids:
        ids = list(ids)
        needed.append(ids.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in ids else len(ids))
    return {"tokens_generated_per_row": steps["n"], "longest_needed": max(needed), "max_completion_length": max_completion_length,
            "stops_at_eos": steps["n"] <= max(needed)}


def probe_dpo(model, tokenizer, pairs: list[dict]) -> dict:
    """Prompt masking of TRL's DPO log-probs (S4), and where its reference weights come from.

    The policy handed to TRL is perturbed in memory after saving, so it differs from its folder on
    disk: TRL's reference log-probs then tell whether the reference is the live initial policy or
    was reloaded from ``config._name_or_path``.
    """
    from datasets import Dataset  # datasets: peer environments only (TRL's)
    from trl import DPOConfig, DPOTrainer  # trl: peer environments only


    folder = model_folder(model, tokenizer)
    live = type(model).from_pretrained(folder)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in live.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    live.eval()
    rows = [{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in pairs]
    args = _cpu_args(DPOConfig, per_device_train_batch_size=len(rows), beta=0.1)
    trainer = DPOTrainer(model=live, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.eval()
    trl_policy = torch.cat(trainer.compute_ref_log_probs(trainer.model, batch)).float()
    reference = trainer.ref_model if trainer.ref_model is not None else trainer.model
    trl_reference = torch.cat(trainer.compute_ref_log_probs(reference, batch)).float()

    # TRL's dataloader shuffles: put our pairs in the order of TRL's chosen rows
    texts = [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True) for ids, mask in
             zip(batch["input_ids"][: len(rows)], batch["attention_mask"][: len(rows)], strict=True)]
    order = [next(i for i, r in enumerate(rows) if r["prompt"] + r["chosen"] == text) for text in texts]
    ours = collate_preferences(tokenizer, [rows[i] for i in order])
    both = build_loss_mask(ours.attention_mask, ours.prompt_lengths, "both")
    none = build_loss_mask(ours.attention_mask, ours.prompt_lengths, "none")
    disk = type(model).from_pretrained(folder).eval()
    with torch.no_grad():
        live_response_only, _ = summed_logprobs(live, ours, both)
        live_with_prompt, _ = summed_logprobs(live, ours, none)
        disk_response_only, _ = summed_logprobs(disk, ours, both)
    gaps = {
        "policy_vs_response_only": float((trl_policy - live_response_only).abs().max()),
        "policy_vs_with_prompt": float((trl_policy - live_with_prompt).abs().max()),
        "reference_vs_live_policy": float((trl_reference - live_response_only).abs().max()),
        "reference_vs_disk": float((trl_reference - disk_response_only).abs().max()),
    }
    return {
        **gaps,
        "prompt_masked_both_sides": gaps["policy_vs_response_only"] < 1e-4,
        "reference": "reloaded from disk" if gaps["reference_vs_disk"] < 1e-4 else
                     ("live initial policy" if gaps["reference_vs_live_policy"] < 1e-4 else "neither"),
    }
