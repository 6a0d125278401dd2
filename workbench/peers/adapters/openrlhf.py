"""OpenRLHF 0.11.2, probed through its own classes and functions (the S1 and S4 fixes, its conventions).

``openrlhf.models`` imports ``flash_attn.bert_padding`` at import time: the environment puts the
STAND-IN ``flash_attn`` (``workbench/peers/standins``) on the path, and every payload lists it.
The models run with ``attn_implementation="eager"`` in fp32; no flash kernel is called.

* ``dpo_mask`` (S4) — ``workbench.audit.check_dpo_mask`` on a ``batch_logps_fn`` that runs
  ``DPOTrainer.concatenated_inputs`` (its ``prompt_id_lens * 2``) and ``DPOTrainer._get_batch_logps``;
  both are methods that use only ``self.tokenizer``, so the trainer is made with ``__new__`` (no
  DeepSpeed strategy) and given the tokenizer.
* ``position_ids`` (S1) — ``workbench.audit.check_position_ids`` on ``Actor.forward(...,
  return_logprobs=True)`` wrapping the shipped GPT-2 (learned absolute positions, where a missing
  position id shows).
* ``aggregation`` — ``check_aggregation`` on ``aggregate_loss`` (both ``token_level_loss``
  settings) and on ``PolicyLoss`` itself at ratio 1 (per-token loss −A).
* ``kl_estimators`` — ``compute_approx_kl`` for k1/k2/k3 on log-ratios in [−30, 30]: formulas, clamps.
* ``entropy_temperature`` — ``Actor(temperature=τ)`` entropy vs the entropy of softmax(logits) and
  of softmax(logits / τ): before or after the temperature.
"""

from __future__ import annotations

import torch

from workbench.audit import check_aggregation, check_dpo_mask, check_position_ids, check_temperature
from workbench.peers import protocol

TEMPERATURE = 0.7


def import_peer():
    import openrlhf.models  # noqa: F401
    from openrlhf.trainer.dpo_trainer import DPOTrainer  # noqa: F401


def gpt2(temperature: float = 1.0):
    """OpenRLHF's ``Actor`` around the shipped tiny GPT-2, loaded by us with transformers (safetensors,
    no remote code: OpenRLHF's own path-loading branch passes ``trust_remote_code=True``, which the
    workbench never does, so the model object is handed to ``Actor`` instead — its documented other
    branch). fp32 for exact checks."""
    from openrlhf.models import Actor  # openrlhf: its peer environment only
    from transformers import AutoModelForCausalLM  # transformers: seconds to import; loaded where a model is

    model = AutoModelForCausalLM.from_pretrained(str(protocol.CHECKPOINTS / "tiny-arith-gpt2"), attn_implementation="eager",
                                                 use_safetensors=True)
    actor = Actor(model.float(), temperature=temperature)
    actor.packing_samples = False  # the model-object branch of Actor.__init__ leaves it unset (path branch: False)
    return actor.eval()


def dpo_row(tokenizer) -> dict:
    from openrlhf.trainer.dpo_trainer import DPOTrainer  # openrlhf: its peer environment only


    trainer = DPOTrainer.__new__(DPOTrainer)  # only self.tokenizer is used by the two methods probed
    trainer.tokenizer = tokenizer

    def batch_logps_fn(token_logps, attention_mask, prompt_lengths):
        b = len(prompt_lengths)
        ids = torch.full(attention_mask.shape, 5, dtype=torch.long)
        _, masks, lens = trainer.concatenated_inputs(ids[:b], attention_mask[:b], ids[b:], attention_mask[b:],
                                                     list(prompt_lengths))
        return trainer._get_batch_logps(token_logps, masks, lens)[0]

    result = check_dpo_mask(batch_logps_fn)
    return protocol.audit_row("dpo_mask", result, prompt_tokens_counted=result.details.get("prompt_tokens_counted"))


def position_row(tokenizer) -> dict:
    actor = gpt2()

    def logprob_fn(model, input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask, return_logprobs=True)

    result = check_position_ids(logprob_fn, actor, tokenizer)
    return protocol.audit_row("position_ids", result, max_abs_gap=result.details["max_abs_gap"])


def temperature_row(tokenizer) -> dict:
    actor = gpt2(temperature=TEMPERATURE)

    def logprob_fn(model, input_ids, attention_mask):  # ``model`` is the HF model inside the actor
        return actor(input_ids, attention_mask=attention_mask, return_logprobs=True)

    result = check_temperature(logprob_fn, actor.model, tokenizer, TEMPERATURE)
    return protocol.audit_row("temperature", result, effective_temperature=result.details.get("effective_temperature"))


def aggregation_rows() -> list[dict]:
    from openrlhf.models import PolicyLoss, aggregate_loss  # openrlhf: its peer environment only


    rows = []
    for token_level in (True, False):
        result = check_aggregation(lambda values, mask, t=token_level: aggregate_loss(values, mask, token_level_loss=t))
        rows.append(protocol.audit_row("aggregation", result, function="aggregate_loss", token_level_loss=token_level,
                                       mode=result.details["mode"]))
    for token_level in (True, False):
        policy = PolicyLoss(token_level_loss=token_level)

        def policy_loss(values, mask, p=policy):
            zeros = torch.zeros(values.shape)
            advantages = -values[:, :1].expand(values.shape)  # ratio 1: the per-token loss is −A
            return p(zeros, zeros, advantages, mask)[0]

        result = check_aggregation(policy_loss)
        rows.append(protocol.audit_row("aggregation", result, function="PolicyLoss", token_level_loss=token_level,
                                       mode=result.details["mode"]))
    return rows


def kl_row() -> dict:
    from openrlhf.models.utils import compute_approx_kl  # openrlhf: its peer environment only

    r = torch.linspace(-30, 30, 241)
    forms = {"k1": r, "k2": 0.5 * r.square(), "k3": torch.expm1(-r.double()).float() + r}
    kinds = {}
    for kind in ("k1", "k2", "k3"):
        value = compute_approx_kl(r, torch.zeros_like(r), kl_estimator=kind)
        inside = r.abs() <= 2
        matches = [n for n, f in forms.items() if torch.allclose(value[inside], f[inside], rtol=1e-4, atol=1e-5)]
        formula = forms[matches[0]] if matches else None
        kinds[kind] = {"formula": matches[0] if matches else "unknown", "max": float(value.max()), "min": float(value.min()),
                       "clamped": bool(formula is not None and not torch.allclose(value, formula, rtol=1e-4, atol=1e-5))}
    return protocol.audit_row("kl_estimators", None, kinds=kinds, grid=[-30, 30])


def entropy_row(tokenizer) -> dict:
    from openrlhf.models.utils import compute_entropy  # openrlhf: its peer environment only

    actor = gpt2(temperature=TEMPERATURE)
    batch = tokenizer(["12+34=46", "56+21=77"], return_tensors="pt", padding=True)  # equal lengths: no padding, so
    # the actor's mask-derived position ids equal the plain forward's below
    with torch.no_grad():
        output = actor(batch["input_ids"], attention_mask=batch["attention_mask"], return_output=True, return_entropy=True)
        logits = actor.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    entropy = output.entropy
    real = batch["attention_mask"][:, :-1].bool()
    raw = compute_entropy(logits)[:, :-1]
    scaled = compute_entropy(logits / TEMPERATURE)[:, :-1]
    gap_raw = float((entropy - raw).abs()[real].max())
    gap_scaled = float((entropy - scaled).abs()[real].max())
    return protocol.audit_row("entropy_temperature", None, temperature=TEMPERATURE, gap_to_entropy_at_1=gap_raw,
                              gap_to_entropy_at_tau=gap_scaled,
                              computed="after temperature" if gap_scaled < 1e-5 < gap_raw else
                                       ("before temperature" if gap_raw < 1e-5 < gap_scaled else "unclear"))


def probes(args) -> list[dict]:
    tokenizer = protocol.load_tokenizer("tiny-arith-gpt2", padding_side="left")
    return [dpo_row(tokenizer), position_row(tokenizer), temperature_row(tokenizer), *aggregation_rows(), kl_row(),
            entropy_row(tokenizer)]


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["openrlhf", "transformers", "deepspeed", "peft"])
