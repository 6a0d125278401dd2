"""The chat-tuned realistic checkpoints (``realistic-<flavour>-chat``): a few seconds of supervised training
on chat-formatted data with ``SFTTrainer``, so that a checkpoint answers, ends its turns with its template's
turn end and has a peaked distribution — what the stop-token, BOS and retokenisation pitfalls need to show.

Why here and not in ``modeling/``: building one means training, and modeling sits below trainers (it
must not import them). ``modeling.realistic`` builds the random checkpoints and names the chat folder
(``chat_folder``); this module trains into it; ``resolve`` (used by ``workbench.experiments.checkpoints.load``,
the loader every notebook calls) turns a ``realistic-…`` name into a folder, training on first use.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from workbench.modeling import realistic
from workbench.modeling.bpe import english_like
from workbench.modeling.models import load_checkpoint
from workbench.modeling.stop_ids import template_turn_end
from workbench.tasks import all_problems
from workbench.trainers.sft import SFTConfig, SFTTrainer

STEPS, BATCH_SIZE, LEARNING_RATE = 150, 32, 3e-3


def chat_examples(n: int, seed: int = 0) -> list[list[dict]]:
    """Conversations: arithmetic questions answered, and requests for a sentence answered with one."""
    rng = random.Random(seed)
    problems = rng.sample(all_problems(), n)
    conversations = []
    for i, p in enumerate(problems):
        if i % 2 == 0:
            conversations.append([{"role": "user", "content": p.prompt}, {"role": "assistant", "content": p.answer}])
        else:
            conversations.append([{"role": "user", "content": "Say something."},
                                  {"role": "assistant", "content": english_like(rng, (3, 6))}])
    return conversations


def chat_training_rows(tokenizer, conversations: list[list[dict]]) -> list[tuple[list[int], list[int]]]:
    """``(ids, loss_mask)`` per conversation: the loss covers the assistant reply and its turn end.

    Ids come from ``apply_chat_template(tokenize=True)`` (one BOS where the template writes it)."""
    rows, turn_end = [], template_turn_end(tokenizer)
    for conversation in conversations:
        prompt = _template_ids(tokenizer, conversation[:-1], add_generation_prompt=True)
        full = _template_ids(tokenizer, conversation, add_generation_prompt=False)
        if full[: len(prompt)] != prompt:
            raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
        end = len(full)
        while end > len(prompt) and full[end - 1] != turn_end:  # drop what follows the turn end ("\n")
            end -= 1
        rows.append((full[:end], [0] * len(prompt) + [1] * (end - len(prompt))))
    return rows


def _template_ids(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _template_ids(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def chat_sft(model, tokenizer, *, steps: int = STEPS, batch_size: int = BATCH_SIZE, lr: float = LEARNING_RATE,
             seed: int = 0) -> list[float]:
    """Train ``model`` in place on chat-formatted examples with ``SFTTrainer`` (fp32 compute, no warm-up,
    no weight decay); the model's dtype and eval mode are restored. Returns the losses."""
    rows = chat_training_rows(tokenizer, chat_examples(steps * batch_size // 4 + batch_size, seed=seed))
    dtype = next(model.parameters()).dtype
    model.float()
    config = SFTConfig(steps=steps, batch_size=batch_size, learning_rate=lr, warmup_steps=0, weight_decay=0.0,
                       seed=seed, progress=False)
    history = SFTTrainer(model, tokenizer, rows, config).train()
    model.to(dtype).eval()
    return [h["loss"] for h in history]


def chat_checkpoint(flavour: str, *, steps: int = STEPS, seed: int = 0) -> Path:
    """A ``flavour`` checkpoint after ``chat_sft`` (cached): it answers and ends turns as its template does."""

    def build(tmp: Path) -> None:
        model, tokenizer = load_checkpoint(realistic.checkpoint(flavour, seed=seed), dtype=None, device="cpu", pad_token="keep")
        losses = chat_sft(model, tokenizer, steps=steps, seed=seed)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "realistic.json").write_text(json.dumps({"flavour": flavour, "version": realistic.VERSION, "seed": seed,
                                                        "chat_sft_steps": steps, "final_loss": losses[-1]}))

    realistic.spec_of(flavour)
    return realistic.cached(realistic.chat_folder(flavour, steps=steps, seed=seed).name, build)


def resolve(name: str) -> str:
    """``realistic-<flavour>`` → its cached folder, ``realistic-<flavour>-chat`` → the chat-SFT one (trained
    on first use); any other name (a built-in name, a checkpoint folder) is returned unchanged. Lets a
    notebook's ``model`` parameter name a realistic checkpoint without a path."""
    if not name.startswith("realistic-"):
        return name
    flavour, chat = realistic.parse_name(name)
    return str(chat_checkpoint(flavour) if chat else realistic.checkpoint(flavour))
