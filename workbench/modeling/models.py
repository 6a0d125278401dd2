"""Loading local Hugging Face checkpoints by name or folder, saving them, and what a loaded model brings.

Nothing here touches a model hub. ``load_checkpoint`` opens a built-in name (``tiny-llama``, ``tiny-qwen2``,
``tiny-gpt2``, the shipped trained ``tiny-arith-*`` checkpoints, the realistic checkpoints) or any
local checkpoint folder, refusing pickle-only weights and remote code (``checkpoint_safety``) and
giving a tokenizer without a pad token a safe one (``pad_policy``). The same notebook therefore runs on
a tiny model here and on a real checkpoint on a GPU by changing one parameter. The other jobs live
beside it: tiny models (``tiny``), attention back-ends (``attention``), dropout (``dropout``),
perturbed copies (``perturbation``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from workbench.core.devices import resolve_device
from workbench.core.errors import ModelLoadError
from workbench.modeling import realistic
from workbench.modeling.attention import resolve_attn_implementation
from workbench.modeling.checkpoint_safety import check_checkpoint_folder
from workbench.modeling.dropout import DROPOUT_CONFIG_FIELDS
from workbench.modeling.pad_policy import check_tokenizer, set_pad_token
from workbench.modeling.stop_ids import stop_token_ids
from workbench.modeling.tiny import RANDOM_BUILTINS, TRAINED_CHECKPOINTS, tiny_model
from workbench.modeling.tokenizer import load_char_tokenizer

BUILTIN_NAMES = tuple(RANDOM_BUILTINS) + tuple(TRAINED_CHECKPOINTS)


def architecture_of(model) -> str:
    """``"llama"``, ``"qwen2"``, ``"gpt2"`` or the model_type of any other model."""
    return model.config.model_type


def uses_rope(model) -> bool:
    """True for rotary (relative) position embeddings, False for learned absolute ones."""
    return architecture_of(model) != "gpt2" and not hasattr(model.config, "n_positions")


def describe(model, tokenizer, *, disk_dtype: str | None = None, pad: str | None = None) -> str:
    """One paragraph on what a checkpoint brings: the things real checkpoints differ in."""
    config = model.config
    dropout = {f: getattr(config, f) for f in DROPOUT_CONFIG_FIELDS if isinstance(getattr(config, f, None), float)}
    lines = [
        f"{config.model_type}, {count_parameters(model) / 1e6:.3g}M parameters, weights "
        f"{f'{disk_dtype} on disk' if disk_dtype else 'built in memory'} → {next(model.parameters()).dtype} on "
        f"{next(model.parameters()).device}; "
        f"positions: {'rotary' if uses_rope(model) else 'learned absolute'}, context {context_length(model)}; "
        f"tied embeddings: {bool(getattr(config, 'tie_word_embeddings', False))}",
        f"BOS {tokenizer.bos_token!r} (added by the tokenizer: {adds_bos(tokenizer)}), EOS {tokenizer.eos_token!r}, "
        f"stop ids {stop_token_ids(model, tokenizer, chat_template=True)}, "
        f"chat template: {bool(getattr(tokenizer, 'chat_template', None))}",
        pad or f"pad token {tokenizer.pad_token!r} (id {tokenizer.pad_token_id})",
        f"dropout in the config: {dropout or 'none'} (the P7 switch disable_dropout sets it to 0 for RL)",
    ]
    return "\n".join(lines)


def adds_bos(tokenizer) -> bool:
    """Whether encoding a text puts the BOS token in front of it."""
    if tokenizer.bos_token_id is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def context_length(model) -> int | None:
    config = model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def load_checkpoint(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype | None = torch.float32,
    attn_implementation: str = "auto",
    device: str | torch.device = "auto",
    pad_token: str | None = "auto",
    allow_pad_equal_eos: bool = False,
    verbose: bool = False,
):
    """``(model, tokenizer)`` for a built-in name whose files exist (or are built without training) or a local
    Hugging Face checkpoint folder: the one loader of Hugging Face folders. Users and notebooks call
    ``workbench.load`` (``workbench.experiments.checkpoints.load``), which also builds the chat-tuned
    ``realistic-<flavour>-chat`` checkpoints by training on first use and then calls this.

    Built-in names: ``tiny-llama``, ``tiny-qwen2``, ``tiny-gpt2`` (random, seed 0), the trained
    ``tiny-arith-qwen2`` / ``tiny-arith-gpt2``, the realistic checkpoints ``realistic-gpt2``,
    ``realistic-qwen2``, ``realistic-qwen2-base``, ``realistic-llama`` (built locally on first use by
    ``workbench.modeling.realistic``) and their ``-chat`` versions once built. Weights must be safetensors;
    remote code is never run. Weights are loaded in ``dtype`` (fp32 by default: fp32 master weights,
    whatever is on disk; None: the dtype on disk; ``precision="bf16-mixed"`` in the trainers computes in
    bf16). ``device="auto"`` picks CUDA when present. ``pad_token="auto"`` gives a tokenizer without one a
    safe pad token (``pad_policy.set_pad_token``); a pad token equal to EOS stays an error (pitfall P8)
    unless ``allow_pad_equal_eos``; ``pad_token="keep"`` leaves the tokenizer exactly as shipped, without
    those checks (for audits of the tokenizer itself, which never pad with it). ``verbose`` prints what the
    checkpoint brings (``describe``).
    """
    from transformers import AutoModelForCausalLM  # transformers: on use (seconds), keeps the CLI's start light
    from transformers.utils import logging as hf_logging  # transformers: seconds to import; loaded where a model is

    hf_logging.disable_progress_bar()  # no per-load "Loading weights" bars in notebooks and logs
    name = str(name_or_path)
    device = resolve_device(device)
    dtype = _checked_dtype(dtype)
    if name in RANDOM_BUILTINS:
        model, tokenizer = tiny_model(RANDOM_BUILTINS[name], dtype=dtype or torch.float32, attn_implementation=attn_implementation)
        return model.to(device), tokenizer
    path = realistic.folder_of(name) if name.startswith("realistic-") else TRAINED_CHECKPOINTS.get(name, Path(name).expanduser())
    check_checkpoint_folder(path, BUILTIN_NAMES)
    implementation = resolve_attn_implementation(attn_implementation, dtype)
    tokenizer = _tokenizer_from_folder(path)
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        attn_implementation=implementation,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
        **({"dtype": dtype} if dtype is not None else {}),
    )
    pad = _pad_policy(model, tokenizer, pad_token, allow_pad_equal_eos)
    model.to(device)
    model.eval()
    if verbose:
        on_disk = json.loads((path / "config.json").read_text())
        print(describe(model, tokenizer, disk_dtype=on_disk.get("torch_dtype") or on_disk.get("dtype"), pad=pad))
    return model, tokenizer


def _checked_dtype(dtype):
    """``load_checkpoint``'s ``dtype``: a ``torch.dtype``, None (the dtype on disk), or the name of a floating dtype
    (``"bfloat16"``; ``"auto"`` is None). Anything else is a ``ModelLoadError`` naming it (transformers
    would read an unknown string as a device: "Invalid device string: 'float16x'")."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return None
    named = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if isinstance(named, torch.dtype) and named.is_floating_point:
        return named
    raise ModelLoadError(f"dtype={dtype!r} is not a floating torch dtype; pass torch.float32 (the default), torch.bfloat16, "
                         "torch.float16, such a name ('bfloat16'), or None (the dtype on disk)")


def _pad_policy(model, tokenizer, pad_token: str | None, allow_pad_equal_eos: bool) -> str:
    """Apply ``load_checkpoint``'s ``pad_token`` (``"keep"``: nothing) and say what the pad token is."""
    if pad_token == "keep":
        return f"pad token {tokenizer.pad_token!r} (id {tokenizer.pad_token_id}) as shipped (pad_token='keep')"
    pad = set_pad_token(model, tokenizer, pad_token)
    check_tokenizer(tokenizer, allow_pad_equal_eos=allow_pad_equal_eos)
    if tokenizer.pad_token_id in stop_token_ids(model, tokenizer) and tokenizer.pad_token_id != tokenizer.eos_token_id:
        pad += (" — also a stop id of the generation config (as in Qwen2.5): harmless here, where masks come from the "
                "attention mask and the stop positions, but a mask built as `ids != pad` would drop that stop action (P8)")
        print(f"note: {pad}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return pad


def load_tokenizer(name_or_path: str | Path):
    """The tokenizer of a checkpoint folder (or a ``realistic-…`` name whose folder exists) alone, as shipped."""
    name = str(name_or_path)
    path = realistic.folder_of(name) if name.startswith("realistic-") else Path(name).expanduser()
    return _tokenizer_from_folder(path)


# The class a saved ``tokenizers`` file (the character tokenizer) names in tokenizer_config.json.
_PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _tokenizer_from_folder(path: Path):
    """The folder's tokenizer as saved. A folder whose tokenizer_config.json names the plain ``tokenizers``
    class (the character tokenizer of the tiny checkpoints) is read with that class: ``AutoTokenizer`` in
    transformers 5 picks the class of the model type instead (``Qwen2Tokenizer`` for a qwen2 config), whose
    own pre-tokenizer drops spaces and skips the lowercasing — ``"sum 3 5 ="`` would reach the model as
    ``"sum35="`` (the arithmetic prompts have neither, so their numbers are the same either way)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # transformers: on use (seconds), keeps the CLI's start light

    config = Path(path) / "tokenizer_config.json"
    named = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    cls = PreTrainedTokenizerFast if named in _PLAIN_TOKENIZER_CLASSES else AutoTokenizer
    return cls.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)


def check_model_name(name: str) -> None:
    """Raise ``ModelLoadError`` unless ``workbench.load(name)`` would find a checkpoint, without loading or
    building one: a built-in name, a valid ``realistic-*`` name, or a safe local checkpoint folder."""
    name = str(name)
    if name in RANDOM_BUILTINS:
        return
    if name.startswith("realistic-"):
        try:
            realistic.parse_name(name)
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        return
    check_checkpoint_folder(TRAINED_CHECKPOINTS.get(name, Path(name).expanduser()), BUILTIN_NAMES)


def tokenizer_fingerprint(name: str) -> tuple[int, str]:
    """``(vocabulary size, hash of the token → id map)`` of the tokenizer ``workbench.load(name)`` starts from,
    loading that tokenizer alone (no weights; a ``realistic-*`` name builds its untrained folder, whose
    tokenizer its ``-chat`` version shares): two checkpoints can score each other's token ids only when
    their fingerprints agree."""
    name = str(name)
    if name in RANDOM_BUILTINS:
        tokenizer = load_char_tokenizer()
    else:
        if name.startswith("realistic-"):
            try:
                flavour, _ = realistic.parse_name(name)
            except ValueError as exc:
                raise ModelLoadError(str(exc)) from None
            folder = realistic.checkpoint(flavour)
        else:
            folder = TRAINED_CHECKPOINTS.get(name, Path(name).expanduser())
        check_checkpoint_folder(folder, BUILTIN_NAMES)
        tokenizer = load_tokenizer(folder)
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return len(vocabulary), hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()[:12]


def check_same_tokenizer(first: str, second: str) -> None:
    """Raise ``ModelLoadError`` naming both checkpoints when their tokenizers differ (size or token ids)."""
    a, b = tokenizer_fingerprint(first), tokenizer_fingerprint(second)
    if a != b:
        raise ModelLoadError(
            f"{first!r} and {second!r} have different tokenizers ({a[0]} tokens, vocabulary hash {a[1]} vs {b[0]} tokens, "
            f"hash {b[1]}): one cannot score the other's token ids. Use two checkpoints of the same tokenizer."
        )


def save(model, tokenizer, folder: str | Path) -> Path:
    """Save a model (safetensors) and its tokenizer to ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    return folder


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
