"""TRL 1.16 pieces wrapped with the ``workbench.audit`` signatures, black-box: TRL's own functions run
on the check's crafted inputs (nothing here re-implements what is being audited).

* ``grpo_loss(trainer, loss_type)``: ``GRPOTrainer._compute_loss`` at β = 0 and ratio 1, where the
  per-token loss is −A_i: the check's row-constant per-token losses become the advantages;
* ``grpo_logprobs(trainer)``: the trainer's log-prob forward ``_get_per_token_logps_and_entropies``
  (it divides by the configured temperature and passes no position ids);
* ``dpo_batch_logps()``: the mask TRL's ``DataCollatorForPreference`` builds, summed over completion
  tokens as ``DPOTrainer`` sums its per-token log-probs.

``grpo_trainer(model, tokenizer, **config)`` builds a CPU GRPOTrainer on a saved copy of the model;
``watched_grpo_step(model, tokenizer)`` runs one GRPOTrainer step with ``workbench.watch.WatchCallback``.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from workbench.core.paths import scratch_folder


def trl_version() -> tuple[bool, str]:
    """(importable, version or the reason it is not)."""
    try:
        import trl
    except Exception as exc:  # ImportError, or a broken install
        return False, f"TRL cannot be imported: {type(exc).__name__}: {exc} (pip install -e '.[peers]')"
    return True, f"trl {trl.__version__}"


@contextmanager
def _without_checkpointing_renames():
    """TRL 1.16 still calls transformers' ``gradient_checkpointing*`` names, each call a FutureWarning about the rename to
    ``activation_checkpointing*`` that its user cannot act on (and that prints the site-packages path): hidden here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(gradient|activation)_checkpointing", category=FutureWarning)
        yield


def grpo_trainer(model, tokenizer, **config):
    """A GRPOTrainer on CPU (no hub, fp32) around a saved copy of ``model``."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from workbench.modeling.models import save

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = str(save(model, tokenizer, Path(scratch_folder("audit-trl-model-"))))
    config = {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 16, "beta": 0.0, **config}
    with _without_checkpointing_renames():
        args = GRPOConfig(output_dir=scratch_folder("audit-trl-"), use_cpu=True, bf16=False, report_to="none",
                          logging_steps=1, max_steps=1, **config)
        trainer = GRPOTrainer(model=folder, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                              train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 8), processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.eval()
    return trainer


def grpo_loss(trainer, loss_type: str):
    """``loss_fn(per_token_loss, mask)`` computed by TRL's GRPO loss with ``loss_type``."""

    def loss_fn(per_token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t = mask.shape
        row_value = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp_min(1)  # the check's rows are constant
        filler = trainer.processing_class("1", add_special_tokens=False)["input_ids"][0]
        inputs = {"prompt_ids": torch.full((b, 2), filler), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
                  "completion_ids": torch.full((b, t), filler), "completion_mask": mask.long(),
                  "advantages": -row_value, "num_items_in_batch": mask.sum()}
        trainer.loss_type = loss_type
        with torch.no_grad():
            return trainer._compute_loss(trainer.model, inputs)

    return loss_fn


def grpo_logprobs(trainer):
    """``logprob_fn(model, input_ids, attention_mask)`` through TRL's GRPO log-prob forward."""

    def logprob_fn(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, input_ids.shape[1] - 1)[0]

    return logprob_fn


def dpo_batch_logps(token_logps: torch.Tensor, attention_mask: torch.Tensor, prompt_lengths: list[int]) -> torch.Tensor:
    """TRL's preference collator rebuilds the batch from its lengths; its completion mask selects the tokens."""
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    b, lengths = len(prompt_lengths), attention_mask.sum(-1).tolist()
    examples = [{"prompt_ids": [5] * p, "chosen_ids": [6] * (lengths[i] - p), "rejected_ids": [6] * (lengths[b + i] - p)}
                for i, p in enumerate(prompt_lengths)]
    batch = DataCollatorForPreference(pad_token_id=0)(examples)
    if batch["attention_mask"].shape != attention_mask.shape or not torch.equal(batch["attention_mask"], attention_mask.long()):
        raise ValueError("TRL's collator laid the batch out differently from the check's right-padded rows")
    return (token_logps * batch["completion_mask"][:, 1:]).sum(-1)


def audit(model, tokenizer, *, temperature: float, loss_types=("grpo", "bnpo", "dr_grpo", "dapo")) -> list:
    """Every check these adapters cover, on one GRPOTrainer sampling at ``temperature``; labelled ``trl …``."""
    from workbench.audit import check_aggregation, check_dpo_mask, run_checks
    from workbench.core import progress

    trainer = grpo_trainer(model, tokenizer, temperature=temperature)
    results = []
    for loss_type in progress.track(loss_types, "TRL loss types", unit="loss type"):
        result = check_aggregation(grpo_loss(trainer, loss_type))
        result.details["label"] = f"trl loss_type={loss_type}"
        results.append(result)
    results += run_checks({"position_ids": grpo_logprobs(trainer), "temperature": grpo_logprobs(trainer)}, trainer.model,
                          tokenizer, temperature=temperature, label="trl GRPOTrainer")
    dpo = check_dpo_mask(dpo_batch_logps)
    dpo.details["label"] = "trl DataCollatorForPreference"
    return results + [dpo]


def watched_grpo_step(model, tokenizer, *, deep: bool = False, prompts=("1+2=", "12+34=", "3*4=", "567-8=")):
    """One ``GRPOTrainer`` step on CPU with ``workbench.watch.WatchCallback`` in its callbacks (no adapter: the
    callback attaches at train begin); returns the callback's report. Prompts of different lengths, so TRL pads them
    on the left."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from workbench.watch import WatchCallback

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    callback = WatchCallback(deep=deep, write_report=False)
    with _without_checkpointing_renames():
        args = GRPOConfig(output_dir=scratch_folder("watch-trl-"), use_cpu=True, bf16=False, report_to="none",
                          logging_steps=1, max_steps=1, per_device_train_batch_size=len(prompts) * 2, num_generations=2,
                          max_completion_length=6, beta=0.0)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
                              args=args, train_dataset=Dataset.from_list([{"prompt": p} for p in prompts] * 4),
                              processing_class=tokenizer, callbacks=[callback])
        trainer.train()
    return callback.report()
