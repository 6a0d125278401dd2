"""Generic records from a trainer's own batch, for runs whose dumps the inspector cannot read safely: verl's
``DataProto.save_to_disk`` pickles the whole object, so the inspector refuses it; in verl's environment, where the user
trusts that pickle (or holds the live batch), ``verl_batch_records(batch, step)`` turns the batch into the generic
format and ``write_jsonl`` saves it. Imports only numpy and the standard library here (torch comes with the batch).

verl's layout (``ray_trainer``, ``rollout_corr_helper``): ``prompts`` (B, P) left-padded, ``responses`` (B, R)
right-padded, ``attention_mask`` (B, P + R), ``response_mask`` (B, R: the loss mask, tool tokens 0 in multi-turn),
``rollout_log_probs`` (the sampler's), ``old_log_probs`` (the trainer's), ``token_level_scores`` (the reward on the
last token), ``non_tensor_batch["uid"]`` (the group) and ``meta_info["temperature"]``.
"""

from __future__ import annotations

import json

import numpy as np


def _numpy(tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy() if tensor.is_floating_point() else tensor.detach().cpu().numpy()


def verl_batch_records(batch, step: int, eos_token_id: int | None = None, policy_version: int | None = None) -> list[dict]:
    """One generic record per row of a verl ``DataProto`` (``finish``: "stop" when the response ends with
    ``eos_token_id``, "length" when it fills the response width without it; absent without ``eos_token_id``)."""
    tensors = batch.batch
    prompts, responses = _numpy(tensors["prompts"]), _numpy(tensors["responses"])
    width = prompts.shape[1]
    attention = _numpy(tensors["attention_mask"]).astype(bool)
    loss_mask = _numpy(tensors["response_mask"]) if "response_mask" in tensors.keys() else attention[:, width:]
    rollout = _numpy(tensors["rollout_log_probs"]) if "rollout_log_probs" in tensors.keys() else None
    trainer = _numpy(tensors["old_log_probs"]) if "old_log_probs" in tensors.keys() else None
    scores = _numpy(tensors["token_level_scores"]).sum(-1) if "token_level_scores" in tensors.keys() else None
    uids = batch.non_tensor_batch.get("uid")
    temperature = batch.meta_info.get("temperature")
    records = []
    for row in range(len(prompts)):
        length = int(attention[row, width:].sum())
        response = responses[row, :length]
        record = {"step": step, "group": str(uids[row]) if uids is not None else str(row),
                  "prompt_ids": prompts[row][attention[row, :width]].tolist(), "response_ids": response.tolist(),
                  "loss_mask": loss_mask[row, :length].astype(int).tolist(),
                  "reward": None if scores is None else float(scores[row])}
        if rollout is not None:
            record["rollout_logprobs"] = rollout[row, :length].astype(float).tolist()
        if trainer is not None:
            record["trainer_logprobs"] = trainer[row, :length].astype(float).tolist()
        if eos_token_id is not None:
            ended = length > 0 and int(response[-1]) == eos_token_id
            record["finish"] = "stop" if ended else ("length" if length == responses.shape[1] else "abort")
        if temperature is not None:
            record["temperature"] = float(temperature)
        if policy_version is not None:
            record["policy_version"] = policy_version
        records.append(record)
    return records


def write_jsonl(records, path, append: bool = False) -> str:
    """Generic records as JSONL (one object per line, UTF-8)."""
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return str(path)
