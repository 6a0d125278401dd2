"""One response of a rollout dump as the inspector reads it (``Rollout``), and the checks that turn a raw record —
a JSON object, a Parquet row, a slime sample — into one, naming the file and line of anything wrong.

The generic format, one record per response (JSONL or Parquet):
``{"step", "group", "prompt_ids", "response_ids", "rollout_logprobs"?, "trainer_logprobs"? ("old_logprobs"
accepted), "loss_mask"? (default all 1), "reward", "finish"? ("stop" | "length" | "abort"), "temperature"?,
"policy_version"?}``. ``loss_mask`` covers the response, or the prompt and the response (then its prompt part shows
whether prompt tokens are trained). A text-only record (``prompt_text``/``response_text`` without ids) is
tokenised and scored when the inspector is given a model.

Token ids become int64 and log-probs float64 numpy arrays: every check downstream is vectorised per response.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.core.errors import InputError

FINISH_REASONS = ("stop", "length", "abort")
LOGPROB_SLACK = 1e-3  # a log-prob above this is not one (rounding of log 1 = 0 aside)
FIELDS = ("step", "group", "prompt_ids", "response_ids", "rollout_logprobs", "trainer_logprobs", "old_logprobs", "loss_mask",
          "reward", "finish", "temperature", "policy_version", "prompt_text", "response_text")
SCHEMA = ('{"step": int, "group": str|int, "prompt_ids": [int], "response_ids": [int], "rollout_logprobs": [float]?, '
          '"trainer_logprobs": [float]?, "loss_mask": [0|1]?, "reward": float, "finish": "stop"|"length"|"abort"?, '
          '"temperature": float?, "policy_version": int?}')


class DumpError(InputError):
    """A dump that cannot be read: the message names the file and line (or record) and the fix."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(slots=True)
class Rollout:
    """One response. Arrays are None when the dump lacks them; ``loss_mask`` is over the response tokens only
    (``prompt_masked_in``: how many prompt tokens the dump's own mask trained)."""

    step: int
    group: str
    prompt_ids: np.ndarray | None
    response_ids: np.ndarray | None
    rollout_logprobs: np.ndarray | None
    trainer_logprobs: np.ndarray | None
    loss_mask: np.ndarray | None
    reward: float | None
    finish: str | None
    temperature: float | None
    policy_version: int | None
    where: str
    prompt_masked_in: int = 0
    prompt_text: str | None = None
    response_text: str | None = None

    @property
    def response_length(self) -> int:
        return 0 if self.response_ids is None else len(self.response_ids)

    def mask(self) -> np.ndarray:
        """The response's loss mask as booleans (all True when the dump has none)."""
        if self.loss_mask is None:
            return np.ones(self.response_length, dtype=bool)
        return self.loss_mask


def _integer(value, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or value != int(value):
        raise DumpError(where, f'"{name}" is {value!r}; give an integer')
    return int(value)


def _ids(value, name: str, where: str) -> np.ndarray:
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise DumpError(where, f'"{name}" is {type(value).__name__}; give a list of token ids')
    try:
        array = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise DumpError(where, f'"{name}" holds something that is not a token id; give a list of integers') from None
    if array.ndim != 1:
        raise DumpError(where, f'"{name}" has shape {array.shape}; give a flat list of token ids')
    return array


def _floats(value, name: str, where: str, length: int) -> np.ndarray:
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise DumpError(where, f'"{name}" is {type(value).__name__}; give a list of floats, one per response token')
    try:
        array = np.asarray(value, dtype=np.float64)  # None (a missing log-prob) becomes NaN
    except (TypeError, ValueError):
        raise DumpError(where, f'"{name}" holds something that is not a number; give a list of floats') from None
    if array.ndim != 1 or len(array) != length:
        raise DumpError(where, f'"{name}" has {array.size} values for {length} response tokens; give one log-prob per '
                               "response token (the dump is cut short or misaligned)")
    if length and np.count_nonzero(array > LOGPROB_SLACK) * 2 > length:  # a few noisy values near 0 pass
        token = int(np.nanargmax(array))
        raise DumpError(where, f'"{name}" is > 0 at {np.count_nonzero(array > LOGPROB_SLACK)} of {length} response tokens '
                               f"(e.g. {array[token]:.4g} at token {token}): log-probs are ≤ 0; are these probabilities, "
                               "logits or negated log-probs? dump log-softmax values")
    return array


def _scalar(value, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DumpError(where, f'"{name}" is {value!r}; give a number')
    return float(value)


def validate(record, where: str) -> Rollout:
    """A ``Rollout`` from one generic record, or ``DumpError`` naming ``where`` (``file:line``) and the field."""
    if not isinstance(record, dict):
        raise DumpError(where, f"the record is a {type(record).__name__}, not an object; one JSON object per line: {SCHEMA}")
    for name in ("step", "group"):
        if record.get(name) is None:
            raise DumpError(where, f'no "{name}"; every record needs "step" and "group": {SCHEMA}')
    step = _integer(record["step"], "step", where)
    group = str(record["group"])
    text_only = record.get("response_ids") is None
    if text_only and not isinstance(record.get("response_text"), str):
        raise DumpError(where, 'no "response_ids" (nor "response_text" for a text-only dump): ' + SCHEMA)
    prompt_ids = None if record.get("prompt_ids") is None else _ids(record["prompt_ids"], "prompt_ids", where)
    response_ids = None if text_only else _ids(record["response_ids"], "response_ids", where)
    length = 0 if response_ids is None else len(response_ids)
    rollout = None if record.get("rollout_logprobs") is None else _floats(record["rollout_logprobs"], "rollout_logprobs", where, length)
    trainer_name = "trainer_logprobs" if record.get("trainer_logprobs") is not None else "old_logprobs"
    trainer = None if record.get(trainer_name) is None else _floats(record[trainer_name], trainer_name, where, length)
    loss_mask, prompt_masked_in = None, 0
    if record.get("loss_mask") is not None and response_ids is not None:
        mask = _ids(record["loss_mask"], "loss_mask", where)
        prompt_length = 0 if prompt_ids is None else len(prompt_ids)
        if len(mask) == prompt_length + length and len(mask) != length:
            prompt_masked_in = int(np.count_nonzero(mask[:prompt_length]))
            mask = mask[prompt_length:]
        elif len(mask) != length:
            raise DumpError(where, f'"loss_mask" has {len(mask)} values for {length} response tokens'
                                   + (f" ({prompt_length} prompt tokens)" if prompt_length else "")
                                   + "; give one 0/1 per response token (or per prompt and response token)")
        loss_mask = mask != 0
    finish = record.get("finish")
    if finish is not None and finish not in FINISH_REASONS:
        raise DumpError(where, f'"finish" is {finish!r}; use one of {FINISH_REASONS} or leave it out')
    version = record.get("policy_version")
    return Rollout(step=step, group=group, prompt_ids=prompt_ids, response_ids=response_ids, rollout_logprobs=rollout,
                   trainer_logprobs=trainer, loss_mask=loss_mask, reward=_scalar(record.get("reward"), "reward", where),
                   finish=finish, temperature=_scalar(record.get("temperature"), "temperature", where),
                   policy_version=None if version is None else _integer(version, "policy_version", where), where=where,
                   prompt_masked_in=prompt_masked_in, prompt_text=record.get("prompt_text"),
                   response_text=record.get("response_text"))
