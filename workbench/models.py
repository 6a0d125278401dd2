"""Tiny models built from configs, and safe loading of local Hugging Face checkpoints.

Nothing here touches a model hub. ``tiny_model`` builds a randomly initialised Llama, Qwen2 or
GPT-2 small enough for a laptop CPU; ``load`` opens a built-in name (``tiny-llama``,
``tiny-qwen2``, ``tiny-gpt2``, the shipped trained ``tiny-arith-*`` checkpoints) or any local
checkpoint folder, refusing pickle-only weights and remote code with an error that says what to
do instead. The same notebook therefore runs on a tiny model here and on a real checkpoint on a
GPU by changing one parameter.

Llama and Qwen2 use rotary position embeddings (relative: a constant position shift is a no-op);
GPT-2 uses learned absolute positions (a shift changes the logits) — the contrast pitfall S1 is
about.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from workbench.errors import AttentionBackendUnavailable, ModelLoadError  # noqa: F401  (re-exported)
from workbench.stop_ids import stop_token_ids  # noqa: F401  (used here; models.stop_token_ids stays public)
from workbench.tokenizer import DATA_DIR, load_char_tokenizer

ARCHITECTURES = ("llama", "qwen2", "gpt2")
ROPE_ARCHITECTURES = ("llama", "qwen2")
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2")

# Shipped checkpoints trained by scripts/train_tiny_checkpoint.py (supervised, arithmetic task).
TRAINED_CHECKPOINTS = {
    "tiny-arith-qwen2": DATA_DIR / "checkpoints" / "tiny-arith-qwen2",
    "tiny-arith-gpt2": DATA_DIR / "checkpoints" / "tiny-arith-gpt2",
}
RANDOM_BUILTINS = {f"tiny-{arch}": arch for arch in ARCHITECTURES}
BUILTIN_NAMES = tuple(RANDOM_BUILTINS) + tuple(TRAINED_CHECKPOINTS)
PICKLE_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


# --------------------------------------------------------------------------------------------
# Attention backend
# --------------------------------------------------------------------------------------------
def flash_attention_status() -> tuple[bool, str]:
    """Whether flash_attention_2 can run here, and the reason when it cannot."""
    if not torch.cuda.is_available():
        return False, "flash-attention needs a CUDA GPU and this machine has none"
    if importlib.util.find_spec("flash_attn") is None:
        return False, "the flash-attn package is not installed (pip install -e '.[gpu]' on a CUDA machine)"
    return True, "flash-attn is installed and CUDA is available"


def resolve_attn_implementation(requested: str = "auto") -> str:
    """Map ``"auto"`` to ``flash_attention_2`` where it can run, else ``sdpa``; validate the rest."""
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation={requested!r} is not one of {ATTN_IMPLEMENTATIONS}")
    available, reason = flash_attention_status()
    if requested == "auto":
        return "flash_attention_2" if available else "sdpa"
    if requested == "flash_attention_2" and not available:
        raise AttentionBackendUnavailable(
            f"attn_implementation='flash_attention_2' cannot run: {reason}. "
            "Use attn_implementation='sdpa' (or 'auto', which falls back to sdpa)."
        )
    return requested


# --------------------------------------------------------------------------------------------
# Tiny models from configs
# --------------------------------------------------------------------------------------------
def tiny_config(arch: str, **overrides):
    """The config of a tiny randomly-initialised model (~0.1M parameters, 64-token vocabulary).

    Dropout is 0 everywhere by default (dropout left on during RL is pitfall P7; pass e.g.
    ``resid_pdrop=0.1`` for GPT-2 or ``attention_dropout=0.1`` for Llama/Qwen2 to switch it on).
    """
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    tokenizer = load_char_tokenizer()
    special = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    hidden = overrides.pop("hidden_size", 64)
    layers = overrides.pop("num_hidden_layers", 2)
    heads = overrides.pop("num_attention_heads", 4)
    max_positions = overrides.pop("max_position_embeddings", 256)
    if arch in ROPE_ARCHITECTURES:
        cls = LlamaConfig if arch == "llama" else Qwen2Config
        config = cls(
            hidden_size=hidden,
            intermediate_size=overrides.pop("intermediate_size", 4 * hidden),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=overrides.pop("num_key_value_heads", max(1, heads // 2)),
            max_position_embeddings=max_positions,
            tie_word_embeddings=overrides.pop("tie_word_embeddings", True),
            attention_dropout=overrides.pop("attention_dropout", 0.0),
            **special,
        )
    elif arch == "gpt2":
        config = GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=max_positions,
            resid_pdrop=overrides.pop("resid_pdrop", 0.0),
            embd_pdrop=overrides.pop("embd_pdrop", 0.0),
            attn_pdrop=overrides.pop("attn_pdrop", 0.0),
            **special,
        )
    else:
        raise ValueError(f"Unknown architecture {arch!r}; choose one of {ARCHITECTURES}")
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise ValueError(f"{type(config).__name__} has no field {key!r}; check the spelling of the override")
        setattr(config, key, value)
    return config


def tiny_model(
    arch: str,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "auto",
    **config_overrides,
):
    """A randomly initialised tiny ``arch`` model and the shipped character tokenizer.

    Same ``seed`` → same weights. ``config_overrides`` change fields of the config (e.g.
    ``hidden_size=128``).
    """
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, **config_overrides)
    config._attn_implementation = resolve_attn_implementation(attn_implementation)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.to(dtype)
    model.eval()
    _set_generation_defaults(model)
    return model, load_char_tokenizer()


def _set_generation_defaults(model) -> None:
    """No implicit generation settings: rollouts pass everything explicitly."""
    gc = model.generation_config
    gc.eos_token_id = model.config.eos_token_id
    gc.pad_token_id = model.config.pad_token_id
    gc.bos_token_id = model.config.bos_token_id


def architecture_of(model) -> str:
    """``"llama"``, ``"qwen2"``, ``"gpt2"`` or the model_type of any other model."""
    return model.config.model_type


def uses_rope(model) -> bool:
    """True for rotary (relative) position embeddings, False for learned absolute ones."""
    return architecture_of(model) != "gpt2" and not hasattr(model.config, "n_positions")


# --------------------------------------------------------------------------------------------
# Loading checkpoints
# --------------------------------------------------------------------------------------------
def check_checkpoint_folder(path: Path) -> None:
    """Raise ``ModelLoadError`` unless ``path`` is a safe, complete local checkpoint folder."""
    if not path.exists():
        raise ModelLoadError(
            f"Checkpoint folder {str(path)!r} does not exist. Pass one of the built-in names "
            f"{', '.join(BUILTIN_NAMES)} or the path of a local Hugging Face checkpoint folder "
            "(nothing is downloaded from a hub)."
        )
    if not path.is_dir():
        raise ModelLoadError(f"{str(path)!r} is a file; pass the checkpoint *folder* that holds config.json.")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{str(path)!r} has no config.json; it is not a Hugging Face checkpoint folder.")
    config = json.loads((path / "config.json").read_text())
    if "auto_map" in config:
        raise ModelLoadError(
            f"{str(path)!r} needs custom code from the checkpoint (config.json has 'auto_map'). "
            "The workbench never uses trust_remote_code; use a checkpoint of an architecture "
            "built into transformers."
        )
    safetensors_files = list(path.glob("*.safetensors"))
    if not safetensors_files:
        pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_WEIGHT_SUFFIXES]
        if pickles:
            raise ModelLoadError(
                f"{str(path)!r} has only pickle weights ({', '.join(sorted(pickles))}); pickle files can "
                "run code when loaded, so the workbench refuses them. Convert the checkpoint once, in a "
                "trusted environment, with `model.save_pretrained(folder, safe_serialization=True)`."
            )
        raise ModelLoadError(f"{str(path)!r} has no *.safetensors weights file.")


def checkpoint_folder(name: str, *, build: bool = True) -> Path | None:
    """Where ``load(name)`` reads a checkpoint: ``None`` for a random built-in (made in memory), the shipped
    folder of a trained built-in, the cached folder of a ``realistic-*`` name (built on first use; with
    ``build=False`` only the name is checked and ``None`` returned), else the path given."""
    if name in RANDOM_BUILTINS:
        return None
    if name.startswith("realistic-"):  # built here from configs with real tokenizers (workbench.realistic)
        from workbench import realistic

        try:
            if not build:
                realistic.parse(name)
                return None
            return Path(realistic.resolve(name))
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
    return TRAINED_CHECKPOINTS.get(name, Path(name).expanduser())


def check_model_name(name: str) -> None:
    """Raise ``ModelLoadError`` unless ``load(name)`` would find a checkpoint, without loading or building
    one: a built-in name, a valid ``realistic-*`` name, or a safe local checkpoint folder."""
    folder = checkpoint_folder(str(name), build=False)
    if folder is not None:
        check_checkpoint_folder(folder)


def tokenizer_fingerprint(name: str) -> tuple[int, str]:
    """``(vocabulary size, hash of the token → id map)`` of the tokenizer ``load(name)`` starts from,
    loading that tokenizer alone (no weights): two checkpoints can score each other's token ids
    only when their fingerprints agree."""
    import hashlib

    folder = checkpoint_folder(str(name))
    if folder is None:
        tokenizer = load_char_tokenizer()
    else:
        from transformers import AutoTokenizer

        check_checkpoint_folder(folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
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


REFERENCE_DRIFT = 0.02  # weight noise of the default reference: KL(policy ‖ reference) ≈ 0.1 nats on the tiny models


def load_reference(reference_model: str | None, policy, *, seed: int = 0, **load_kwargs):
    """The reference model a notebook compares ``policy`` with: ``reference_model`` loaded with ``load``,
    or, when it is ``None``, the policy's own checkpoint with ``REFERENCE_DRIFT`` × N(0, 1) noise on every
    weight (``perturbed_copy``) — a policy that has drifted from its reference by a known amount, with
    the same tokenizer by construction."""
    if reference_model is None:
        return perturbed_copy(policy, REFERENCE_DRIFT, seed=seed)
    reference, _ = load(reference_model, **load_kwargs)
    return reference


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
        from transformers.utils import logging as hf_logging

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
            "that never ends a response to workbench.models.load (not the EOS token: see pitfall P8)."
        )
    if tokenizer.pad_token_id == tokenizer.eos_token_id and not allow_pad_equal_eos:
        raise ModelLoadError(
            f"The tokenizer's pad token equals its EOS token ({tokenizer.eos_token!r}): masks built from "
            "`ids != pad` then drop the EOS action and the policy never learns to stop (pitfall P8). "
            f"Pass pad_token='{ADDED_PAD_TOKEN}' (added to the vocabulary) or another token to load() "
            "(--pad-token on the command line, the pad_token notebook parameter), or allow_pad_equal_eos=True "
            "to reproduce the bug."
        )


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when available, else the CPU; anything else as given (a clear error for CUDA
    asked on a machine without it)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device='cuda' was asked for but this machine has no CUDA GPU; use device='auto' or 'cpu'.")
    return device


def describe(model, tokenizer, *, disk_dtype: str | None = None, pad: str | None = None) -> str:
    """One paragraph on what a checkpoint brings: the things real checkpoints differ in."""
    config = model.config
    dropout = {f: getattr(config, f) for f in DROPOUT_CONFIG_FIELDS if isinstance(getattr(config, f, None), float)}
    lines = [
        f"{config.model_type}, {count_parameters(model) / 1e6:.3g}M parameters, weights {disk_dtype or 'built in memory'} "
        f"on disk → {next(model.parameters()).dtype} on {next(model.parameters()).device}; "
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


def load(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "auto",
    device: str | torch.device = "auto",
    pad_token: str | None = "auto",
    allow_pad_equal_eos: bool = False,
    verbose: bool = False,
):
    """``(model, tokenizer)`` for a built-in name or a local Hugging Face checkpoint folder.

    Built-in names: ``tiny-llama``, ``tiny-qwen2``, ``tiny-gpt2`` (random, seed 0), the trained
    ``tiny-arith-qwen2`` / ``tiny-arith-gpt2``, and the realistic checkpoints ``realistic-gpt2``,
    ``realistic-qwen2``, ``realistic-llama`` (``-chat`` for chat-tuned ones; built locally on first use
    by ``workbench.realistic``). Weights must be safetensors; remote code is never run. Weights are
    loaded in ``dtype`` (fp32 by default: fp32 master weights, whatever is on disk;
    ``precision="bf16-mixed"`` in the trainers computes in bf16). ``device="auto"`` picks CUDA when
    present. ``pad_token="auto"`` gives a tokenizer without one a safe pad token (``set_pad_token``);
    a pad token equal to EOS stays an error (pitfall P8) unless ``allow_pad_equal_eos``.
    ``verbose`` prints what the checkpoint brings (``describe``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no per-load "Loading weights" bars in notebooks and logs
    name = str(name_or_path)
    device = resolve_device(device)
    if name in RANDOM_BUILTINS:
        model, tokenizer = tiny_model(RANDOM_BUILTINS[name], dtype=dtype, attn_implementation=attn_implementation)
        return model.to(device), tokenizer
    path = checkpoint_folder(name)
    check_checkpoint_folder(path)
    implementation = resolve_attn_implementation(attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=dtype,
        attn_implementation=implementation,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
    )
    pad = set_pad_token(model, tokenizer, pad_token)
    check_tokenizer(tokenizer, allow_pad_equal_eos=allow_pad_equal_eos)
    if tokenizer.pad_token_id in stop_token_ids(model, tokenizer) and tokenizer.pad_token_id != tokenizer.eos_token_id:
        pad += (" — also a stop id of the generation config (as in Qwen2.5): harmless here, where masks come from the "
                "attention mask and the stop positions, but a mask built as `ids != pad` would drop that stop action (P8)")
        print(f"note: {pad}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    model.eval()
    if verbose:
        on_disk = json.loads((path / "config.json").read_text())
        print(describe(model, tokenizer, disk_dtype=on_disk.get("torch_dtype") or on_disk.get("dtype"), pad=pad))
    return model, tokenizer


def save(model, tokenizer, folder: str | Path) -> Path:
    """Save a model (safetensors) and its tokenizer to ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    return folder


DROPOUT_CONFIG_FIELDS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout",
                         "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout")


def disable_dropout(model) -> int:
    """Set every dropout probability of ``model`` to 0 (modules, attention attributes, config).

    The fix for pitfall P7: with dropout on, two forwards of the same weights disagree, so the
    first-step importance ratio is not 1 and the KL to an identical reference is not 0. Returns
    how many dropout sites were switched off.
    """
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            module.p = 0.0
            changed += 1
        if isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0:
            module.attention_dropout = 0.0
            changed += 1
    config = getattr(model, "config", None)
    for field in DROPOUT_CONFIG_FIELDS:
        if config is not None and isinstance(getattr(config, field, None), float):
            setattr(config, field, 0.0)
    return changed


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def perturb_(model, scale: float, seed: int = 0):
    """Add ``scale`` × N(0, 1) noise to every parameter of ``model`` in place (a fixed ``seed``
    gives the same noise), and return the model: a policy a known distance from its reference."""
    generator = torch.Generator().manual_seed(seed)
    for parameter in model.parameters():
        noise = torch.randn(parameter.shape, generator=generator)
        parameter.add_((scale * noise).to(device=parameter.device, dtype=parameter.dtype))
    return model


def perturbed_copy(model, scale: float, seed: int = 0):
    """A deep copy of ``model`` with ``perturb_`` noise; the original is untouched."""
    import copy

    return perturb_(copy.deepcopy(model), scale, seed)
