"""Which ids end a response — one place for the library and for pitfall P17.

A checkpoint names its stop token in three places that can disagree: ``tokenizer.eos_token``,
``generation_config.eos_token_id`` (an id or a list: Qwen2.5-Instruct stops on ``<|im_end|>`` and
``<|endoftext|>``), and, implicitly, its chat template, which ends every assistant turn with some
token (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3). The rollouts stop on, and post-EOS
masking treats as EOS, the union of all three (``stop_token_ids``); notebook 17 compares subsets of
the sources (``stop_id_sources``, ``union_stop_ids``) to show what each partial choice costs.
"""

from __future__ import annotations

from workbench.core.errors import ModelLoadError

SOURCES = ("tokenizer", "generation_config", "template_turn_end")


def template_turn_end(tokenizer) -> int:
    """The id of the special token the chat template writes right after an assistant message.
    Raises ``ValueError`` when the template ends a turn with plain text (or there is no template)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template")
    sentinel = "Zq7"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": sentinel}],
                                         tokenize=False)
    after = text.split(sentinel, 1)[1]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    if not ids or ids[0] not in special:
        raise ValueError(f"the chat template ends an assistant turn with {after!r}, not with a special token")
    return ids[0]


def stop_id_sources(generation_config, tokenizer, *, chat_template: bool = True) -> dict[str, list[int]]:
    """The stop ids each source names: ``{"tokenizer", "generation_config", "template_turn_end"}``
    (an empty list where a source names none; the template's only with ``chat_template``)."""
    configured = getattr(generation_config, "eos_token_id", None)
    configured = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    turn_end = []
    if chat_template and getattr(tokenizer, "chat_template", None):
        try:
            turn_end = [template_turn_end(tokenizer)]
        except ValueError:
            pass  # a template whose turn end is plain text: nothing to stop on
    return {"tokenizer": [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)],
            "generation_config": [int(i) for i in configured], "template_turn_end": turn_end}


def union_stop_ids(sources: dict[str, list[int]], use: tuple[str, ...] = SOURCES) -> list[int]:
    """Sorted, de-duplicated stop ids of the sources named in ``use`` (the fix: all three)."""
    unknown = set(use) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown stop-id sources {sorted(unknown)}; use any of {SOURCES}")
    ids = sorted({i for name in use for i in sources[name]})
    if not ids:
        raise ValueError(f"no stop id in the sources {use}: the policy could never stop")
    return ids


def stop_token_ids(model, tokenizer, *, chat_template: bool = False) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS ∪ the generation config's EOS ∪, when
    prompts go through the chat template, the template's turn end (pitfall P17)."""
    sources = stop_id_sources(getattr(model, "generation_config", None), tokenizer, chat_template=chat_template)
    try:
        return union_stop_ids(sources)
    except ValueError:
        raise ModelLoadError("neither the tokenizer nor the generation config names an EOS token: rollouts could never stop. "
                             "Set tokenizer.eos_token (or generation_config.eos_token_id) in the checkpoint folder.") from None
