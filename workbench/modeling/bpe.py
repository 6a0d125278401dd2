"""Byte-level BPE tokenizers trained locally in seconds, in the style of GPT-2, Qwen2 and Llama 3.

Each family's pre-tokenizer pattern (GPT-2 groups digits, Qwen2 splits them one by one, Llama 3 groups
up to three), a small local corpus (the task's prompts and answers plus English-like sentences of
common words) and ``build_tokenizer``, which trains a ``tokenizers`` BPE on it and wraps it as a
``PreTrainedTokenizerFast`` with the special tokens, BOS post-processor and chat template of a
realistic checkpoint's spec (``workbench.modeling.realistic.Spec``). No hub, no download.
"""

from __future__ import annotations

import random

from workbench.tasks import all_problems

VOCAB_SIZE = 512

# Pre-tokenizer patterns in the style of each family: GPT-2 groups digits, Qwen2 splits them one
# by one, Llama 3 groups up to three.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_CONTRACTIONS_AND_WORDS = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"""
_PUNCTUATION_AND_SPACE = r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_PATTERN = _CONTRACTIONS_AND_WORDS + r"|\p{N}" + _PUNCTUATION_AND_SPACE
LLAMA3_PATTERN = _CONTRACTIONS_AND_WORDS + r"|\p{N}{1,3}" + _PUNCTUATION_AND_SPACE

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


def english_like(rng: random.Random, n_words: tuple[int, int] = (5, 12)) -> str:
    """One sentence of common English words: capitalised, ends with a full stop or question mark."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(*n_words))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice(".....?!")


def corpus(n_sentences: int = 3000, seed: int = 0) -> list[str]:
    """The local training text of every flavour's BPE: task prompts with answers, and sentences."""
    rng = random.Random(seed)
    problems = all_problems()
    rng.shuffle(problems)
    lines = [f"{p.prompt}{p.answer}" for p in problems[:4000]]
    lines += [f"What is {p.prompt[:-1]}? The answer is {p.answer}." for p in problems[4000:5000]]
    lines += [english_like(rng) for _ in range(n_sentences)]
    return lines


def build_tokenizer(spec, vocab_size: int = VOCAB_SIZE, seed: int = 0):
    """A byte-level BPE ``PreTrainedTokenizerFast`` for ``spec`` (a ``realistic.Spec``), trained on ``corpus()``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # tokenizers, transformers: on use
    from transformers import PreTrainedTokenizerFast  # (seconds), keeps the CLI's start light

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
