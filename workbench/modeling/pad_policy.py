"""The pad-token policy: a tokenizer without a pad token gets one that never ends a response.

A pad token equal to EOS (or any stop id) makes masks built as ``ids != pad`` drop the stop action,
so the policy never learns to stop (pitfall P8): ``set_pad_token`` picks a pad-like special token the
tokenizer already has, else adds ``<|pad|>``; ``check_tokenizer`` refuses pad == EOS unless opted in.
"""

from __future__ import annotations

from workbench.core.errors import ModelLoadError
from workbench.modeling.stop_ids import stop_token_ids

PAD_LIKE = ("pad", "reserved", "unused")
ADDED_PAD_TOKEN = "<|pad|>"


def choose_pad_token(model, tokenizer) -> tuple[str, bool]:
    """A pad token for a tokenizer that has none, never EOS or any stop id: an existing special
    token whose name says it is never generated (``pad``/``reserved``/``unused``, e.g. Llama 3's
    ``<|finetune_right_pad_id|>``), else a new ``<|pad|>``. Returns ``(token, added)``."""
    taken = set(stop_token_ids(model, tokenizer)) | {tokenizer.bos_token_id, tokenizer.unk_token_id}
    candidates = [(i, t.content) for i, t in sorted(tokenizer.added_tokens_decoder.items())
                  if t.special and i not in taken and any(word in t.content.lower() for word in PAD_LIKE)]
    candidates.sort(key=lambda c: (0 if "pad" in c[1].lower() else 1, c[0]))
    if candidates:
        return candidates[0][1], False
    return ADDED_PAD_TOKEN, True


def set_pad_token(model, tokenizer, pad_token: str | None) -> str:
    """Give ``tokenizer`` a pad token (``"auto"``/None: ``choose_pad_token``; a string: that token,
    added to the vocabulary if new); the embeddings grow when a token is added. Returns what was done."""
    if pad_token in (None, "auto"):
        if tokenizer.pad_token_id is not None:
            return f"pad token {tokenizer.pad_token!r} (id {tokenizer.pad_token_id}) from the tokenizer"
        pad_token, _ = choose_pad_token(model, tokenizer)
        how = "chosen automatically: the tokenizer has none"
    else:
        how = "as asked"
    before = len(tokenizer)
    if pad_token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"pad_token": pad_token})
    else:
        tokenizer.pad_token = pad_token
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        from transformers.utils import logging as hf_logging  # transformers: on use (seconds), keeps the CLI's start light

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its note on mean resizing is said here instead: new rows = old mean
        try:
            model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
        finally:
            hf_logging.set_verbosity(verbosity)
        how += f"; added to the vocabulary ({before} → {len(tokenizer)} tokens, embeddings resized)"
    else:
        how += "; an existing token"
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return f"pad token {tokenizer.pad_token!r} (id {tokenizer.pad_token_id}) {how}"


def check_tokenizer(tokenizer, *, allow_pad_equal_eos: bool = False, stop_ids: list[int] | None = None) -> None:
    """Refuse tokenizers without a pad token or whose pad token ends responses (pad == EOS, pitfall P8)
    unless opted in."""
    if tokenizer.pad_token_id is None:
        raise ModelLoadError(
            "The tokenizer has no pad token. Pass pad_token='auto' (a safe choice, printed) or the name of a token "
            "that never ends a response to workbench.load (not the EOS token: see pitfall P8)."
        )
    if tokenizer.pad_token_id == tokenizer.eos_token_id and not allow_pad_equal_eos:
        raise ModelLoadError(
            f"The tokenizer's pad token equals its EOS token ({tokenizer.eos_token!r}): masks built from "
            "`ids != pad` then drop the EOS action and the policy never learns to stop (pitfall P8). "
            f"Pass pad_token='{ADDED_PAD_TOKEN}' (added to the vocabulary) or another token to load() "
            "(--pad-token on the command line, the pad_token notebook parameter), or allow_pad_equal_eos=True "
            "to reproduce the bug."
        )
