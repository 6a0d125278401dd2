"""S5 inside a TRL environment: the release's own ``GRPOTrainer`` loss on crafted batches.

Runs in the TRL 0.15.2 / 0.16.1 environments and in the project's own (TRL 1.16). Two probes:

* ``s5_zero_loss`` — the seed's probe: β = 0, one iteration (ratio 1), one group with rewards
  [1, 0, 0, 0] and completions of unequal lengths; advantages by TRL's convention (Bessel std,
  ε = 1e-4). Per-sequence normalisation gives exactly 0; a global token mean does not.
* ``aggregation`` — ``workbench.audit.check_aggregation`` on a ``loss_fn(per_token_loss, mask)``
  that drives the trainer's own loss method: with β = 1 and ratio 1 a GRPO per-token loss is
  −A_i + k3(ref − log p), so advantages and reference log-probs are chosen to make it equal the
  audit's per-token losses exactly (``protocol.grpo_inputs_for_token_losses``).

* ``position_ids`` — ``workbench.audit.check_position_ids`` on the trainer's own log-prob forward
  with the shipped GPT-2 (learned absolute positions, where missing position ids show: S1).

TRL 1.16 is probed for each ``loss_type`` (grpo, bnpo, dr_grpo, dapo); older releases have one loss.
"""

from __future__ import annotations

import torch

from workbench.audit import check_aggregation, check_position_ids
from workbench.core.paths import scratch_folder
from workbench.peers import protocol

PROMPT = "12+34="
LENGTHS = (2, 3, 5, 8)
REWARDS = (1.0, 0.0, 0.0, 0.0)


def import_peer():
    import trl  # noqa: F401
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401


def trl_version() -> tuple[int, ...]:
    import trl  # trl: peer environments only

    return tuple(int(p) for p in trl.__version__.split(".")[:2])


def make_trainer(folder: str, tokenizer, beta: float, width: int, loss_type: str | None = None):
    from datasets import Dataset  # datasets: peer environments only (TRL's)
    from trl import GRPOConfig, GRPOTrainer  # trl: peer environments only

    config = {"output_dir": scratch_folder("peer-grpo-"), "use_cpu": True, "bf16": False, "report_to": "none",
              "per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": width, "beta": beta,
              "max_steps": 1, "logging_steps": 1}
    if loss_type is not None:
        config["loss_type"] = loss_type
    trainer = GRPOTrainer(model=folder, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=GRPOConfig(**config), train_dataset=Dataset.from_list([{"prompt": PROMPT}] * 8),
                          processing_class=tokenizer)
    trainer.model.eval()
    if hasattr(trainer, "current_gradient_accumulation_steps"):
        trainer.current_gradient_accumulation_steps = 1
    return trainer


def per_token_logps(trainer, input_ids, attention_mask, width):
    model = trainer.model
    if hasattr(trainer, "_get_per_token_logps_and_entropies"):  # TRL >= 0.19
        return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, width)[0]
    return trainer._get_per_token_logps(model, input_ids, attention_mask, width)


def trainer_loss(trainer, tokenizer, advantages_or_losses, mask, beta):
    """The trainer's own loss method on one batch: rows = completions, ``mask`` = completion mask.

    ``advantages_or_losses``: a (B,) tensor of advantages, or a (B, T) tensor of per-token losses."""
    b, width = mask.shape
    prompt = torch.tensor([tokenizer(PROMPT)["input_ids"]] * b)
    digits = tokenizer("0123456789", add_special_tokens=False)["input_ids"]
    completion = torch.tensor([[digits[(i + j) % len(digits)] for j in range(width)] for i in range(b)])
    completion = torch.where(mask.bool(), completion, torch.full_like(completion, tokenizer.pad_token_id))
    input_ids = torch.cat([prompt, completion], 1)
    attention = torch.cat([torch.ones_like(prompt), mask.long()], 1)
    with torch.no_grad():
        logps = per_token_logps(trainer, input_ids, attention, width)
        if advantages_or_losses.dim() == 2:
            advantages, ref = protocol.grpo_inputs_for_token_losses(advantages_or_losses, logps, beta)
        else:
            advantages, ref = advantages_or_losses.float(), logps.clone()
        inputs = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
                  "completion_mask": mask.long(), "advantages": advantages, "ref_per_token_logps": ref,
                  "old_per_token_logps": logps, "num_items_in_batch": mask.sum().float()}
        if hasattr(trainer, "_compute_loss"):  # TRL >= 0.17 splits compute_loss
            return trainer._compute_loss(trainer.model, inputs)
        return trainer.compute_loss(trainer.model, inputs)


def position_result(tokenizer_name: str = "tiny-arith-gpt2"):
    """``check_position_ids`` on the trainer's own log-prob forward (GPT-2: learned absolute positions)."""
    tokenizer = protocol.load_tokenizer(tokenizer_name)
    model = protocol.load_model(tokenizer_name)
    folder = protocol.save_model_folder(model, tokenizer, scratch_folder("peer-model-"))
    trainer = make_trainer(folder, tokenizer, beta=0.0, width=8)

    def logprob_fn(model, input_ids, attention_mask):
        return per_token_logps(trainer, input_ids, attention_mask, input_ids.shape[1] - 1)

    return check_position_ids(logprob_fn, trainer.model, tokenizer)


def group_advantages(rewards) -> torch.Tensor:
    """TRL's group advantage: (r − mean) / (Bessel std + 1e-4)."""
    r = torch.tensor(rewards)
    return (r - r.mean()) / (r.std() + 1e-4)


def probes(args) -> list[dict]:
    from transformers import __version__ as tf_version  # transformers: seconds to import; loaded where a model is


    tokenizer = protocol.load_tokenizer()
    model = protocol.load_model()
    folder = protocol.save_model_folder(model, tokenizer, scratch_folder("peer-model-"))
    loss_types = [None] if trl_version() < (0, 17) else list(args.get("loss_types", ["grpo", "bnpo", "dr_grpo", "dapo"]))
    width = max(LENGTHS)
    mask = (torch.arange(width)[None] < torch.tensor(LENGTHS)[:, None]).long()
    advantages = group_advantages(REWARDS)
    rows = []
    for loss_type in loss_types:
        label = {"loss_type": loss_type} if loss_type else {}
        if args.get("zero_loss_probe", True):
            zero = make_trainer(folder, tokenizer, beta=0.0, width=width, loss_type=loss_type)
            loss = float(trainer_loss(zero, tokenizer, advantages, mask, 0.0))
            rows.append(protocol.audit_row("s5_zero_loss", None, loss=loss, lengths=list(LENGTHS), rewards=list(REWARDS),
                                           advantages=advantages.tolist(), transformers=tf_version, **label))
        trainer = make_trainer(folder, tokenizer, beta=1.0, width=8, loss_type=loss_type)
        result = check_aggregation(lambda values, m, t=trainer: trainer_loss(t, tokenizer, values, m, 1.0))
        rows.append(protocol.audit_row("aggregation", result, mode=result.details["mode"], **label))
    if args.get("position_probe", True):
        result = position_result()
        rows.append(protocol.audit_row("position_ids", result, max_abs_gap=result.details["max_abs_gap"]))
    return rows


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["trl", "transformers", "accelerate", "datasets"])
