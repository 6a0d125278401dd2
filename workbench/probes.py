"""Black-box probes of another framework's conventions — here TRL (the optional ``peers`` extra).

Each probe feeds a real TRL trainer crafted inputs and classifies what comes out; none reads
TRL's source. Everything runs on CPU with a local model folder (``use_cpu=True, bf16=False,
report_to="none"``, ``HF_HUB_OFFLINE=1``).

* ``probe_grpo_aggregation``: for each TRL ``loss_type``, TRL's own loss on a fixed group of
  unequal-length completions (β = 0, ρ ≡ 1, so each token's loss is −A_i), matched against the
  value of every workbench aggregation mode;
* ``probe_position_ids``: TRL's GRPO log-prob path on left-padded prompts vs a forward with
  mask-derived position ids (S1);
* ``probe_dpo``: whether TRL's DPO log-probs leave prompt tokens out on both sides (S4), and
  whether its reference is the live initial policy or reloaded from disk;
* ``probe_eos``: decoding steps TRL's GRPO generation takes vs what the completions needed (S3).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from workbench import losses
from workbench.batching import pad_sequences
from workbench.models import save
from workbench.scoring import response_logprobs

TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def trl_available() -> tuple[bool, str]:
    try:
        import trl

        return True, f"trl {trl.__version__}"
    except ImportError:
        return False, "TRL is not installed (pip install -e '.[peers]')"


def _cpu_args(config_cls, **overrides):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return config_cls(output_dir=tempfile.mkdtemp(prefix="trl-probe-"), use_cpu=True, bf16=False, report_to="none",
                      logging_steps=1, max_steps=1, **overrides)


def model_folder(model, tokenizer) -> str:
    """Save a model to a temporary local checkpoint folder (what TRL loads)."""
    return str(save(model, tokenizer, Path(tempfile.mkdtemp(prefix="trl-model-"))))


def grpo_trainer(folder: str, tokenizer, **config):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 8, "beta": 0.0, **config}
    trainer = GRPOTrainer(
        model=folder, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=_cpu_args(GRPOConfig, **config),
        train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 8), processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def _completion_batch(tokenizer, prompt: str, completions: list[str]):
    prompt_ids, prompt_mask = pad_sequences([tokenizer(prompt)["input_ids"]] * len(completions), tokenizer.pad_token_id, side="left")
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    completion_ids, completion_mask = pad_sequences(rows, tokenizer.pad_token_id, side="right")
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def probe_grpo_aggregation(folder: str, tokenizer, completions=("46", "4", "4612", "-1"), rewards=(1.0, 0.0, 0.0, 0.0),
                           max_completion_length: int = 8) -> list[dict]:
    """For each TRL loss_type: TRL's loss value and the workbench mode(s) whose value it matches."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = _completion_batch(tokenizer, "12+34=", list(completions))
    advantages = losses.group_advantages(torch.tensor(rewards), len(rewards), "group")
    per_token = -advantages[:, None].expand(completion_ids.shape).float()
    candidates = {mode: float(losses.aggregate_loss(per_token, completion_mask, mode, max_len=max_completion_length))
                  for mode in losses.LOSS_AGG_MODES}
    rows = []
    for loss_type in TRL_LOSS_TYPES:
        trainer = grpo_trainer(folder, tokenizer, loss_type=loss_type, max_completion_length=max_completion_length)
        trainer.model.eval()  # one batch, no accumulation window
        inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask, "advantages": advantages,
                  "num_items_in_batch": completion_mask.sum().float()}
        with torch.no_grad():
            value = float(trainer._compute_loss(trainer.model, inputs))
        matches = [m for m, v in candidates.items() if abs(v - value) <= 1e-6 * max(1.0, abs(value))]
        rows.append({"loss_type": loss_type, "trl_loss": value, "matches": matches,
                     "classified_as": matches[0] if len(matches) == 1 else ("ambiguous" if matches else "none")})
    return rows


def probe_position_ids(folder: str, tokenizer, prompts=("1+2=", "12+34=", "5*5=", "99-9="), completions=("3", "46", "25", "90")) -> dict:
    """Largest |Δ log p| between TRL's GRPO log-prob forward and a mask-position forward, left-padded prompts."""
    trainer = grpo_trainer(folder, tokenizer)
    model = trainer.model.eval()
    rows_prompt = [tokenizer(p)["input_ids"] for p in prompts]
    prompt_ids, prompt_mask = pad_sequences(rows_prompt, tokenizer.pad_token_id, side="left")
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    completion_ids, completion_mask = pad_sequences(rows, tokenizer.pad_token_id, side="right")
    with torch.no_grad():
        trl_logps = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), completion_ids.shape[1]
        )[0]
        ours = response_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, position_ids="mask")
    gap = ((trl_logps - ours) * completion_mask).abs()
    return {"max_abs_logp_gap": float(gap.max()), "max_ratio_deviation": float((gap.max()).exp() - 1),
            "sequence_logp_gap": float(gap.sum(-1).max())}


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
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from workbench.trainers.dpo import build_loss_mask, collate_preferences, summed_logprobs

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
             zip(batch["input_ids"][: len(rows)], batch["attention_mask"][: len(rows)])]
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
