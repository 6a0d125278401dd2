"""S3 inside a TRL environment: does the release's own rollout stop at EOS?

* TRL 0.11.x ``PPOv2Trainer``: one ``train()`` batch on the shipped tiny Qwen2 (policy, reference,
  and a tiny reward / value model built from its config), with the default ``stop_token=None`` and with
  ``stop_token="eos"``. The policy's ``generate`` is wrapped (on our model object, not TRL's code) to
  count its decoding forwards and keep what it returned: decoding steps per batch vs the longest
  response up to its first EOS.
* TRL >= 0.14 ``GRPOTrainer`` (the fixed side, TRL 1.16 in the project's environment): one call of its
  generation method, counted the same way.

The model is trained on arithmetic and ends its answers with EOS after a few tokens, so the tokens
needed are far fewer than ``response_length``.
"""

from __future__ import annotations

import torch

from workbench.core.paths import scratch_folder
from workbench.peers import protocol

PROMPTS = ("12+34=", "5*5=", "1+2=", "99-9=")
RESPONSE_LENGTH = 32


def import_peer():
    import trl  # noqa: F401


def counting_generate(model, log: dict):
    """Wrap ``model.generate`` (instance attribute) to count decoding forwards and keep outputs."""
    original = model.generate

    def hook(module, args, kwargs):
        if log["active"]:
            log["forwards"] += 1

    model.register_forward_pre_hook(hook, with_kwargs=True)

    def generate(*args, **kwargs):
        log["active"] = True
        try:
            out = original(*args, **kwargs)
        finally:
            log["active"] = False
        sequences = out.sequences if hasattr(out, "sequences") else out
        context = (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape[1]
        log["responses"].append(sequences[:, context:].detach().clone())
        log["calls"] += 1
        return out

    model.generate = generate
    return log


def needed_tokens(responses: torch.Tensor, eos_id: int) -> list[int]:
    """Tokens each row needed: up to and including its first EOS (the full row when it has none)."""
    out = []
    for row in responses.tolist():
        out.append(row.index(eos_id) + 1 if eos_id in row else len(row))
    return out


def summary(log: dict, eos_id: int, max_new_tokens: int, **extra) -> dict:
    responses = torch.cat(log["responses"]) if log["responses"] else torch.zeros(0, 0, dtype=torch.long)
    needed = needed_tokens(responses, eos_id)
    generated = int(responses.shape[1]) if responses.numel() else 0
    return {"decoding_forwards": log["forwards"], "tokens_generated_per_row": generated, "longest_needed": max(needed),
            "needed_per_row": needed, "max_new_tokens": max_new_tokens,
            "rows_with_eos": sum(eos_id in r for r in responses.tolist()),
            "wasted_steps": generated - max(needed), "wasted_tokens": generated * len(needed) - sum(needed), **extra}


def ppo_v2_trainer(stop_token):
    """TRL 0.11's ``PPOv2Trainer`` for one batch of ``PROMPTS`` on the shipped tiny Qwen2 (left-padded prompts, a
    tiny reward / value model from its config, learning rate 0): returns (trainer, policy, tokenizer, config)."""
    from datasets import Dataset  # datasets: peer environments only (TRL's)
    from transformers import AutoModelForSequenceClassification  # transformers: seconds to import; loaded where a model is
    from trl import PPOv2Config, PPOv2Trainer  # trl: peer environments only

    tokenizer = protocol.load_tokenizer()
    policy, ref = protocol.load_model(), protocol.load_model()
    torch.manual_seed(0)
    reward = AutoModelForSequenceClassification.from_config(protocol.load_config(num_labels=1))
    value = AutoModelForSequenceClassification.from_config(protocol.load_config(num_labels=1))
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    width = max(len(r) for r in ids)
    padded = [[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids]
    dataset = Dataset.from_dict({"input_ids": padded})
    config = PPOv2Config(output_dir=scratch_folder("peer-ppov2-"), per_device_train_batch_size=len(PROMPTS),
                         gradient_accumulation_steps=1, num_mini_batches=1, total_episodes=len(PROMPTS), num_ppo_epochs=1,
                         response_length=RESPONSE_LENGTH, stop_token=stop_token, report_to="none", use_cpu=True, bf16=False,
                         num_sample_generations=0, local_rollout_forward_batch_size=len(PROMPTS), save_strategy="no",
                         temperature=1.0, seed=0, logging_steps=1, learning_rate=0.0)
    trainer = PPOv2Trainer(config=config, tokenizer=tokenizer, policy=policy, ref_policy=ref, reward_model=reward,
                           value_model=value, train_dataset=dataset)
    return trainer, policy, tokenizer, config


def ppo_v2_rollout(stop_token) -> dict:
    trainer, policy, tokenizer, config = ppo_v2_trainer(stop_token)
    log = counting_generate(policy, {"forwards": 0, "calls": 0, "responses": [], "active": False})
    eos_after_init = policy.generation_config.eos_token_id
    trainer.train()
    return summary(log, tokenizer.eos_token_id, RESPONSE_LENGTH, stop_token=stop_token, generation_config_eos=eos_after_init,
                   stop_token_id=config.stop_token_id)


def grpo_trainer():
    """TRL >= 0.14's ``GRPOTrainer`` on the shipped tiny Qwen2 (loaded from a saved folder, as users do), one
    batch of ``PROMPTS`` with 4 generations each: returns (trainer, tokenizer)."""
    from datasets import Dataset  # datasets: peer environments only (TRL's)
    from trl import GRPOConfig, GRPOTrainer  # trl: peer environments only

    tokenizer = protocol.load_tokenizer()
    model = protocol.load_model()
    folder = protocol.save_model_folder(model, tokenizer, scratch_folder("peer-model-"))
    config = GRPOConfig(output_dir=scratch_folder("peer-grpo-"), use_cpu=True, bf16=False, report_to="none",
                        per_device_train_batch_size=4, num_generations=4, max_completion_length=RESPONSE_LENGTH, beta=0.0,
                        max_steps=1, logging_steps=1, seed=0)
    trainer = GRPOTrainer(model=folder, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]), processing_class=tokenizer)
    return trainer, tokenizer


def grpo_rollout() -> dict:
    trainer, tokenizer = grpo_trainer()
    log = counting_generate(trainer.model, {"forwards": 0, "calls": 0, "responses": [], "active": False})
    with torch.no_grad():
        if hasattr(trainer, "_generate"):  # TRL >= 0.20
            trainer._generate(list(PROMPTS))
        else:
            trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS])
    return summary(log, tokenizer.eos_token_id, RESPONSE_LENGTH)


def probes(args) -> list[dict]:
    import trl  # trl: peer environments only

    if hasattr(trl, "PPOv2Trainer"):
        return [protocol.audit_row("s3_eos_stopping", None, trainer="PPOv2Trainer", **ppo_v2_rollout(None)),
                protocol.audit_row("s3_eos_stopping_stop_token", None, trainer="PPOv2Trainer", **ppo_v2_rollout("eos"))]
    return [protocol.audit_row("s3_eos_stopping", None, trainer="GRPOTrainer", **grpo_rollout())]


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["trl", "transformers", "accelerate", "datasets"])
