"""``check_eos_stopping``: does a ``generate_fn`` stop decoding once every row has produced EOS (S3)?

::

    generate_fn(model, input_ids: Tensor[B, P], attention_mask: Tensor[B, P], max_new_tokens: int)
        -> Tensor[B, P + R]          # prompt followed by the response, like ``model.generate``

The prompts are left-padded. To know exactly when each row *should* stop, the check makes the
model's answer certain for the duration of the call: a forward hook replaces the last position's
logits so that row i emits ``stop_after[i]`` filler tokens and then EOS (then filler again). Every
decoding step is one forward of the model, so counting forwards counts steps. With correct
stopping the batch takes max(stop_after) + 1 forwards; a generate without ``eos_token_id`` runs to
``max_new_tokens`` (TRL's old PPOTrainer). The hook is removed afterwards, whatever happens.

The forcing reaches any engine that calls the given model's ``forward`` (``generate``, a
hand-written loop); an external engine (vLLM, SGLang) is out of its reach.
"""

from __future__ import annotations

import torch

from workbench.audit.logprobs import _device_of, encode, pad_id_of, pad_rows
from workbench.audit.result import AuditResult
from workbench.audit.signatures import first_call, require_signature, require_tensor
from workbench.core.errors import AuditSignatureError

EXPECTED = ("generate_fn(model, input_ids: Tensor[B, P], attention_mask: Tensor[B, P], max_new_tokens: int) "
            "-> Tensor[B, P + R]")
PROMPTS = ("12+34=", "5*5=", "1+2=", "99-9=")
STOP_AFTER = (1, 2, 3, 4)


def _eos_id(model, tokenizer) -> int:
    for owner in (tokenizer, getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(owner, "eos_token_id", None)
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if isinstance(value, int):
            return value
    raise ValueError("neither the tokenizer nor the model config names an eos_token_id: the check needs one")


def _filler_id(tokenizer, vocab: int, eos: int) -> int:
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | {eos, pad_id_of(tokenizer)}
    return next(i for i in range(vocab) if i not in special)


class _ForceStops:
    """A forward hook making row i emit ``stop_after[i]`` filler tokens then EOS; counts forwards."""

    def __init__(self, stop_after, eos: int, tokenizer):
        self.stop_after, self.eos, self.tokenizer, self.calls = list(stop_after), eos, tokenizer, 0

    def __call__(self, module, args, kwargs, output):
        logits = output.logits if hasattr(output, "logits") else output[0]
        step = self.calls
        self.calls += 1
        filler = _filler_id(self.tokenizer, logits.shape[-1], self.eos)
        forced = torch.full_like(logits[:, -1], -1e4)
        for row in range(logits.shape[0]):
            token = self.eos if step == self.stop_after[row % len(self.stop_after)] else filler
            forced[row, token] = 0.0
        logits = logits.clone()
        logits[:, -1] = forced
        if hasattr(output, "logits"):
            output.logits = logits
            return output
        return (logits,) + tuple(output[1:])


def check_eos_stopping(generate_fn, model, tokenizer, *, prompts=PROMPTS, stop_after=STOP_AFTER,
                       max_new_tokens: int = 16) -> AuditResult:
    """S3: decoding forwards and tokens generated vs needed when rows end after ``stop_after`` tokens + EOS.

    ``details``: ``forwards`` (decoding steps taken), ``longest_needed`` (max(stop_after) + 1),
    ``wasted_steps`` (= forwards − longest_needed, the metric), ``tokens_generated`` (B × R, R the
    response width returned), ``tokens_needed`` (Σ up to each EOS), ``eos_positions`` (where EOS
    landed in each row's response; −1 when it never did).
    """
    require_signature(generate_fn, "check_eos_stopping", EXPECTED, 4)
    if max_new_tokens <= max(stop_after) + 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must exceed the longest forced response ({max(stop_after) + 1})")
    eos = _eos_id(model, tokenizer)
    rows = [row for row in encode(tokenizer, prompts)]
    ids, mask = pad_rows(rows, pad_id_of(tokenizer), "left", max(len(r) for r in rows))
    device = _device_of(model)
    ids, mask = ids.to(device), mask.to(device)
    force = _ForceStops(stop_after, eos, tokenizer)
    handle = model.register_forward_hook(force, with_kwargs=True)
    try:
        with torch.no_grad():
            out = first_call(generate_fn, "check_eos_stopping", EXPECTED, model, ids, mask, max_new_tokens)
    finally:
        handle.remove()
    if hasattr(out, "sequences"):  # a GenerateOutput (return_dict_in_generate=True)
        out = out.sequences
    out = require_tensor(out, "check_eos_stopping", EXPECTED)
    if out.dim() != 2 or out.shape[0] != ids.shape[0] or out.shape[1] < ids.shape[1] or \
            not torch.equal(out[:, : ids.shape[1]].cpu(), ids.cpu()):
        raise AuditSignatureError(f"check_eos_stopping: {EXPECTED} must return the prompt ids followed by the response "
                                  f"(like generate); got shape {tuple(out.shape)} for prompts of shape {tuple(ids.shape)}")
    response = out[:, ids.shape[1]:].cpu()
    width = response.shape[1]
    eos_positions = []
    for row in response.tolist():
        eos_positions.append(row.index(eos) if eos in row else -1)
    needed = [k + 1 for k in stop_after[: len(rows)]]
    longest = max(needed)
    followed = eos_positions == [k for k in stop_after[: len(rows)]]
    wasted = force.calls - longest
    passed = followed and force.calls <= longest and width <= longest
    if not followed:
        convention = "did not emit the forced EOS (a logits processor, min_new_tokens or an external engine?)"
    elif passed:
        convention = "stops at EOS"
    elif force.calls >= max_new_tokens:
        convention = "runs to max_new_tokens (no EOS stopping)"
    else:
        convention = f"stops late ({wasted} extra decoding steps)"
    post_eos = sum(1 for row, pos in zip(response.tolist(), eos_positions, strict=True) if pos >= 0
                   for token in row[pos + 1:] if token != pad_id_of(tokenizer))
    details = {
        "metric": "wasted decoding steps",
        "value": wasted,
        "forwards": force.calls,
        "longest_needed": longest,
        "max_new_tokens": max_new_tokens,
        "wasted_steps": wasted,
        "response_width": width,
        "tokens_generated": width * len(rows),
        "tokens_needed": sum(needed),
        "waste_fraction": 1 - sum(needed) / max(width * len(rows), 1),
        "eos_positions": eos_positions,
        "non_pad_tokens_after_eos": post_eos,
        "plot": {
            "kind": "bar",
            "x": [f"row {i}" for i in range(len(rows))],
            "series": {"tokens generated": [width] * len(rows), "tokens needed (up to EOS)": needed},
            "xlabel": "batch row",
            "ylabel": "response tokens",
            "title": convention,
        },
    }
    return AuditResult("eos", passed, convention, details)
