"""Small realistic Hugging Face checkpoints, built locally in seconds (no hub).

Real checkpoints differ from the workbench's character-tokenizer models in ways that break
RL code: byte-level BPE (one answer, several tokens; decode → encode is not the identity), GPT-2
without a pad token and with BOS = EOS, Qwen2 without any BOS and with two stop ids, Llama 3
whose tokenizer adds BOS by itself while its chat template writes one too. ``build(flavour)``
makes a tiny random model of each kind with a real ``tokenizers`` BPE tokenizer trained on a
small local corpus (the task's prompts and answers plus generated English-like sentences):

* ``gpt2``  — byte-level BPE, ``<|endoftext|>`` is BOS = EOS = UNK, no pad token, no chat
  template, dropout 0.1 everywhere, learned absolute positions;
* ``qwen2`` — Qwen2.5-Instruct-like: byte-level BPE with single-digit pre-tokenization, no BOS,
  a ChatML chat template, tokenizer EOS ``<|im_end|>``, pad ``<|endoftext|>``,
  ``generation_config.eos_token_id = [<|im_end|>, <|endoftext|>]``, bf16 weights on disk, tied
  embeddings;
* ``qwen2-base`` — the same tokenizer and template as a base checkpoint ships them: EOS and
  generation-config EOS are ``<|endoftext|>`` while the template ends turns with ``<|im_end|>``
  (the stop-token mismatch of pitfall P17);
* ``llama`` — Llama-3-like: the tokenizer's post-processor adds ``<|begin_of_text|>``, the chat
  template starts with ``{{ bos_token }}`` (pitfall P21), turns end with ``<|eot_id|>``, no pad.

Folders are cached under ``$WORKBENCH_CACHE`` (default: the system temp dir) keyed by
``VERSION``, so tests and notebooks build each one once; a build writes to a temporary folder
and renames it into place. The tokenizers are trained by ``workbench.modeling.bpe``. The ``-chat``
versions (a few seconds of supervised training on chat-formatted data, so that a checkpoint answers
and ends its turns) are trained in the trainers layer, ``workbench.trainers.realistic_chat``, into the
folder ``chat_folder`` names here; ``folder_of`` maps a ``realistic-…`` name to its folder and says how
to build a chat one that is not in the cache yet.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.core.errors import ModelLoadError
from workbench.modeling.bpe import GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, build_tokenizer

VERSION = "2"  # 2: the chat-SFT folders are trained by trainers.SFTTrainer (trainers/realistic_chat.py)
FLAVOURS = ("gpt2", "qwen2", "qwen2-base", "llama")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Spec:
    """What distinguishes one flavour: tokens, template, architecture, dtype on disk."""

    arch: str
    special_tokens: tuple[str, ...]
    pattern: str
    bos: str | None
    eos: str
    pad: str | None
    generation_eos: tuple[str, ...]
    chat_template: str | None = None
    add_bos: bool = False
    dtype: torch.dtype = torch.float32
    dropout: float = 0.0


SPECS = {
    "gpt2": Spec("gpt2", ("<|endoftext|>",), GPT2_PATTERN, bos="<|endoftext|>", eos="<|endoftext|>", pad=None,
                 generation_eos=("<|endoftext|>",), dropout=0.1),
    "qwen2": Spec("qwen2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), QWEN2_PATTERN, bos=None, eos="<|im_end|>",
                  pad="<|endoftext|>", generation_eos=("<|im_end|>", "<|endoftext|>"), chat_template=CHATML_TEMPLATE,
                  dtype=torch.bfloat16),
    "qwen2-base": Spec("qwen2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), QWEN2_PATTERN, bos=None,
                       eos="<|endoftext|>", pad="<|endoftext|>", generation_eos=("<|endoftext|>",),
                       chat_template=CHATML_TEMPLATE, dtype=torch.bfloat16),
    "llama": Spec("llama", ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                  LLAMA3_PATTERN, bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None,
                  generation_eos=("<|end_of_text|>", "<|eot_id|>"), chat_template=LLAMA3_TEMPLATE, add_bos=True),
}

# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def build_config(spec: Spec, tokenizer, hidden: int = 64, layers: int = 2, heads: int = 4):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config  # transformers: seconds to import; loaded where a model is

    ids = {"bos": tokenizer.convert_tokens_to_ids(spec.bos or spec.special_tokens[0]),
           "eos": tokenizer.convert_tokens_to_ids(spec.eos)}
    if spec.arch == "gpt2":
        return GPT2Config(vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=heads, n_positions=128,
                          resid_pdrop=spec.dropout, embd_pdrop=spec.dropout, attn_pdrop=spec.dropout,
                          bos_token_id=ids["bos"], eos_token_id=ids["eos"])
    cls = Qwen2Config if spec.arch == "qwen2" else LlamaConfig
    config = cls(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                 num_attention_heads=heads, num_key_value_heads=heads // 2, max_position_embeddings=128,
                 tie_word_embeddings=spec.arch == "qwen2", bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                 rope_theta=10000.0)
    config.dtype = spec.dtype
    return config


def generation_config(spec: Spec, tokenizer):
    from transformers import GenerationConfig  # transformers: seconds to import; loaded where a model is

    stop = [tokenizer.convert_tokens_to_ids(t) for t in spec.generation_eos]
    kwargs = {"eos_token_id": stop if len(stop) > 1 else stop[0]}
    if spec.bos is not None:
        kwargs["bos_token_id"] = tokenizer.convert_tokens_to_ids(spec.bos)
    if spec.pad is not None:
        kwargs["pad_token_id"] = tokenizer.convert_tokens_to_ids(spec.pad)
    if spec.chat_template is CHATML_TEMPLATE and spec.eos == "<|im_end|>":  # Qwen2.5-Instruct's sampling defaults
        kwargs.update(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    return GenerationConfig(**kwargs)


def write_checkpoint(flavour: str, folder: str | Path, *, seed: int = 0) -> Path:
    """Build ``flavour`` from scratch into ``folder`` (random weights, safetensors)."""
    from transformers import AutoModelForCausalLM  # transformers: seconds to import; loaded where a model is
    from transformers.utils import logging as hf_logging  # transformers: seconds to import; loaded where a model is

    hf_logging.disable_progress_bar()
    spec = spec_of(flavour)
    tokenizer = build_tokenizer(spec, seed=seed)
    config = build_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = generation_config(spec, tokenizer)
    model.to(spec.dtype)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    (folder / "realistic.json").write_text(json.dumps({"flavour": flavour, "version": VERSION, "seed": seed}))
    return folder


# --------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------
def spec_of(flavour: str) -> Spec:
    if flavour not in SPECS:
        raise ValueError(f"Unknown realistic checkpoint flavour {flavour!r}; choose one of {FLAVOURS}")
    return SPECS[flavour]


def cache_dir() -> Path:
    root = Path(os.environ.get("WORKBENCH_CACHE") or Path(tempfile.gettempdir()) / "workbench-cache")
    return root / "realistic" / f"v{VERSION}"


def cached(name: str, build) -> Path:
    """``cache_dir()/name``, built by ``build(tmp_folder)`` on first use and renamed into place."""
    target = cache_dir() / name
    if (target / "realistic.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep its folder
            if not (target / "realistic.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def checkpoint(flavour: str, *, seed: int = 0) -> Path:
    """The folder of a random ``flavour`` checkpoint, built once per cache."""
    spec_of(flavour)
    return cached(f"{flavour}-seed{seed}", lambda tmp: write_checkpoint(flavour, tmp, seed=seed))


def chat_folder(flavour: str, *, steps: int = 150, seed: int = 0) -> Path:
    """Where the chat-SFT version of ``flavour`` lives in the cache (built by ``trainers.realistic_chat``)."""
    return cache_dir() / f"{flavour}-chat{steps}-seed{seed}"


def parse_name(name: str) -> tuple[str, bool]:
    """``realistic-<flavour>[-chat]`` → ``(flavour, chat)``; ``ValueError`` naming the choices otherwise."""
    flavour = name.removeprefix("realistic-")
    chat = flavour.endswith("-chat")
    flavour = flavour.removesuffix("-chat")
    if flavour not in FLAVOURS:
        raise ValueError(f"{name!r}: unknown flavour {flavour!r}; use realistic-<flavour>[-chat] with one of {FLAVOURS}")
    if chat and spec_of(flavour).chat_template is None:
        raise ValueError(f"{name!r}: the {flavour} flavour has no chat template, so there is no chat-SFT version")
    return flavour, chat


def folder_of(name: str) -> Path:
    """The folder of ``realistic-<flavour>`` (built here on first use) or of ``realistic-<flavour>-chat``
    when the trainers layer has built it; ``ModelLoadError`` naming the fix otherwise."""
    try:
        flavour, chat = parse_name(name)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if not chat:
        return checkpoint(flavour)
    folder = chat_folder(flavour)
    if not (folder / "realistic.json").is_file():
        raise ModelLoadError(
            f"{name!r} is built by training (a few seconds of chat SFT) and is not in the cache yet: load it with "
            "workbench.load (workbench.experiments.checkpoints.load), which builds it, or build it once with "
            f"`python scripts/make_realistic_checkpoints.py --chat {flavour}`."
        )
    return folder
