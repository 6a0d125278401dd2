"""The shipped character-level tokenizer.

Every tiny model in the workbench uses one 64-symbol character tokenizer so that token ids are
easy to read in a plot: one character, one token. It is built here from code (reproducible, no
hub) and shipped as ``data/tokenizer/tokenizer.json`` (a plain ``tokenizers`` file, loadable by
``transformers.PreTrainedTokenizerFast``).

The three special tokens are distinct on purpose: ``<pad>`` (id 0) is never ``<eos>`` (id 2),
because a pad token equal to EOS makes ``ids != pad`` masks drop the EOS action (pitfall P8).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from workbench.core.paths import DATA_DIR

# each special token's role (the tokenizer's keyword) and text, in id order: <pad> 0, <bos> 1, <eos> 2, <unk> 3
SPECIAL_TOKEN_ROLES = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = SPECIAL_TOKEN_ROLES.values()
SPECIAL_TOKENS = list(SPECIAL_TOKEN_ROLES.values())
# 4 special + space + 10 digits + 23 punctuation + 26 letters = 64 symbols.
CHARACTERS = " 0123456789" + "+-*/=()?.,:;!'\"_#%&[]@$" + "abcdefghijklmnopqrstuvwxyz"

TOKENIZER_DIR = DATA_DIR / "tokenizer"


def build_char_tokenizer():
    """Build the character tokenizer as a ``PreTrainedTokenizerFast`` (left padding, BOS added)."""
    from transformers import PreTrainedTokenizerFast  # transformers: seconds to import; loaded where a model is

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + list(CHARACTERS))}
    assert len(vocab) == 64, len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, padding_side="left", model_max_length=256, **SPECIAL_TOKEN_ROLES)


def load_char_tokenizer():
    """Load the shipped tokenizer from ``data/tokenizer`` (no network)."""
    from transformers import PreTrainedTokenizerFast  # transformers: seconds to import; loaded where a model is

    if not (TOKENIZER_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"The shipped tokenizer is missing at {TOKENIZER_DIR}/tokenizer.json. "
            "Rebuild it with `python scripts/make_tokenizer.py`."
        )
    return PreTrainedTokenizerFast.from_pretrained(str(TOKENIZER_DIR))
