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
and renames it into place. ``chat_sft`` gives a checkpoint a few seconds of supervised training on
chat-formatted data, so that it answers, ends its turns with the template's turn end and has a
peaked distribution — what the stop-token, BOS and retokenisation pitfalls need to show.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.stop_ids import template_turn_end  # noqa: F401  (used below; public here too)

VERSION = "1"
FLAVOURS = ("gpt2", "qwen2", "qwen2-base", "llama")
VOCAB_SIZE = 512

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Pre-tokenizer patterns in the style of each family: GPT-2 groups digits, Qwen2 splits them one
# by one, Llama 3 groups up to three.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_CONTRACTIONS_AND_WORDS = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"""
_PUNCTUATION_AND_SPACE = r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_PATTERN = _CONTRACTIONS_AND_WORDS + r"|\p{N}" + _PUNCTUATION_AND_SPACE
LLAMA3_PATTERN = _CONTRACTIONS_AND_WORDS + r"|\p{N}{1,3}" + _PUNCTUATION_AND_SPACE


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

WORDS = (
    "the a an one some every this that these those my your our their his her its no any each other "
    "cat dog bird fish tree river road house city garden window door table book letter number answer question "
    "water light stone cloud field market school friend teacher doctor farmer child world morning evening night "
    "day year time way hand head heart voice story song game plan idea problem reason result sum total value "
    "is was are were has had will can could would should must may might does did makes made takes took gives "
    "gave finds found sees saw knows knew thinks thought says said adds added counts counted keeps kept "
    "runs ran walks walked opens opened reads read writes wrote helps helped learns learned carries carried "
    "small large old new good bad long short quick slow bright dark warm cold green blue red quiet happy simple "
    "careful strange early late near far high low first last next same different whole half little great "
    "and but or so because when while if then after before since until though where here there again also "
    "very just still never always often soon now today together almost really quite perhaps only even "
    "in on at by with from to of for into over under about across through between behind along around"
).split()


# --------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------
def english_like(rng: random.Random, n_words: tuple[int, int] = (5, 12)) -> str:
    """One sentence of common English words: capitalised, ends with a full stop or question mark."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(*n_words))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(".....?!")


def corpus(n_sentences: int = 3000, seed: int = 0) -> list[str]:
    """The local training text of every flavour's BPE: task prompts with answers, and sentences."""
    from workbench.tasks import all_problems

    rng = random.Random(seed)
    problems = all_problems()
    rng.shuffle(problems)
    lines = [f"{p.prompt}{p.answer}" for p in problems[:4000]]
    lines += [f"What is {p.prompt[:-1]}? The answer is {p.answer}." for p in problems[4000:5000]]
    lines += [english_like(rng) for _ in range(n_sentences)]
    return lines


def build_tokenizer(spec: Spec, vocab_size: int = VOCAB_SIZE, seed: int = 0):
    """A byte-level BPE ``PreTrainedTokenizerFast`` for ``spec``, trained on ``corpus()``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(spec.special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus(seed=seed), trainer)
    if spec.add_bos:
        bos_id = backend.token_to_id(spec.bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos} $B", special_tokens=[(spec.bos, bos_id)])
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    kwargs = {"bos_token": spec.bos, "eos_token": spec.eos, "pad_token": spec.pad}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=128, padding_side="left",
                                        **{k: v for k, v in kwargs.items() if v is not None})
    if spec.arch == "gpt2":
        tokenizer.unk_token = spec.eos
    if spec.chat_template is not None:
        tokenizer.chat_template = spec.chat_template
    return tokenizer


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def build_config(spec: Spec, tokenizer, hidden: int = 64, layers: int = 2, heads: int = 4):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

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
    from transformers import GenerationConfig

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
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

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


def _cached(name: str, build) -> Path:
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
    return _cached(f"{flavour}-seed{seed}", lambda tmp: write_checkpoint(flavour, tmp, seed=seed))


def load_hf(folder: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
    """``(model, tokenizer)`` with transformers directly (safetensors, no remote code), in eval mode,
    on ``device`` (``"auto"``: CUDA when present, as ``workbench.models.resolve_device``).

    ``workbench.models.load`` refuses tokenizers without a pad token (GPT-2, Llama 3); the
    diagnostics that need those checkpoints load them here and never pad with EOS.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False,
                                                 use_safetensors=True, **({"dtype": dtype} if dtype else {}))
    from workbench.models import resolve_device

    model.to(resolve_device(device)).eval()
    return model, tokenizer


def load_tokenizer(folder: str | Path):
    """The tokenizer of a checkpoint folder alone (no weights loaded)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)


# --------------------------------------------------------------------------------------------
# A few seconds of chat SFT: a policy that answers and ends its turns
# --------------------------------------------------------------------------------------------
def chat_examples(n: int, seed: int = 0) -> list[list[dict]]:
    """Conversations: arithmetic questions answered, and requests for a sentence answered with one."""
    from workbench.tasks import all_problems

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


def chat_sft(model, tokenizer, *, steps: int = 150, batch_size: int = 32, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Train ``model`` in place on chat-formatted examples (fp32 compute); returns the losses."""
    from workbench.batching import pad_sequences
    from workbench.scoring import logprobs_from_logits

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # masked out: any id will do
    rows = chat_training_rows(tokenizer, chat_examples(steps * batch_size // 4 + batch_size, seed=seed))
    rng = random.Random(seed)
    dtype = next(model.parameters()).dtype
    model.float().train()
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        batch = rng.sample(rows, batch_size)
        ids, attention = pad_sequences([r[0] for r in batch], pad, side="right")
        loss_mask, _ = pad_sequences([r[1] for r in batch], 0, side="right")
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        mask = loss_mask[:, 1:].float()
        loss = -(logprobs_from_logits(logits, ids[:, 1:]) * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.to(dtype).eval()
    return losses


def chat_checkpoint(flavour: str, *, steps: int = 150, seed: int = 0) -> Path:
    """A ``flavour`` checkpoint after ``chat_sft`` (cached): it answers and ends turns as its template does."""

    def build(tmp: Path) -> None:
        model, tokenizer = load_hf(checkpoint(flavour, seed=seed))
        losses = chat_sft(model, tokenizer, steps=steps, seed=seed)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "realistic.json").write_text(json.dumps({"flavour": flavour, "version": VERSION, "seed": seed,
                                                        "chat_sft_steps": steps, "final_loss": losses[-1]}))

    return _cached(f"{flavour}-chat{steps}-seed{seed}", build)


def parse(name: str) -> tuple[str, bool]:
    """``realistic-<flavour>[-chat]`` → ``(flavour, chat)``, checked without building anything; a
    ``ValueError`` naming the valid flavours otherwise."""
    flavour = name.removeprefix("realistic-")
    chat = flavour.endswith("-chat")
    flavour = flavour.removesuffix("-chat")
    if flavour not in FLAVOURS:
        raise ValueError(f"{name!r}: unknown flavour {flavour!r}; use realistic-<flavour>[-chat] with one of {FLAVOURS}")
    if chat and spec_of(flavour).chat_template is None:
        raise ValueError(f"{name!r}: the {flavour} flavour has no chat template, so there is no chat-SFT version")
    return flavour, chat


def resolve(name: str) -> str:
    """``realistic-<flavour>`` → its cached folder, ``realistic-<flavour>-chat`` → the chat-SFT one;
    any other name (a built-in name, a checkpoint folder) is returned unchanged. Lets a notebook's
    ``model`` parameter name a realistic checkpoint without a path."""
    if not name.startswith("realistic-"):
        return name
    flavour, chat = parse(name)
    return str(chat_checkpoint(flavour) if chat else checkpoint(flavour))
