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


def check_tokenizer(tokenizer, *, allow_pad_equal_eos: bool = False) -> None:
    """Refuse tokenizers without a pad token or with pad == EOS (pitfall P8) unless opted in."""
    if tokenizer.pad_token_id is None:
        raise ModelLoadError(
            "The tokenizer has no pad token. Pass pad_token='<an existing token that never ends a "
            "response>' to workbench.models.load (not the EOS token: see pitfall P8)."
        )
    if tokenizer.pad_token_id == tokenizer.eos_token_id and not allow_pad_equal_eos:
        raise ModelLoadError(
            f"The tokenizer's pad token equals its EOS token ({tokenizer.eos_token!r}): masks built from "
            "`ids != pad` then drop the EOS action and the policy never learns to stop (pitfall P8). "
            "Pass pad_token='<another token>' to load(), or allow_pad_equal_eos=True to reproduce the bug."
        )


def load(
    name_or_path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "auto",
    device: str | torch.device = "cpu",
    pad_token: str | None = None,
    allow_pad_equal_eos: bool = False,
):
    """``(model, tokenizer)`` for a built-in name or a local Hugging Face checkpoint folder.

    Built-in names: ``tiny-llama``, ``tiny-qwen2``, ``tiny-gpt2`` (random, seed 0) and the trained
    ``tiny-arith-qwen2`` / ``tiny-arith-gpt2``. Weights must be safetensors; remote code is
    never run. ``pad_token`` sets a pad token for tokenizers that lack one.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no per-load "Loading weights" bars in notebooks and logs
    name = str(name_or_path)
    if name in RANDOM_BUILTINS:
        model, tokenizer = tiny_model(RANDOM_BUILTINS[name], dtype=dtype, attn_implementation=attn_implementation)
        return model.to(device), tokenizer
    path = TRAINED_CHECKPOINTS.get(name, Path(name).expanduser())
    check_checkpoint_folder(path)
    implementation = resolve_attn_implementation(attn_implementation)
    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    if pad_token is not None:
        tokenizer.pad_token = pad_token
    check_tokenizer(tokenizer, allow_pad_equal_eos=allow_pad_equal_eos)
    model = AutoModelForCausalLM.from_pretrained(
        str(path),
        dtype=dtype,
        attn_implementation=implementation,
        use_safetensors=True,
        trust_remote_code=False,
        local_files_only=True,
    )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    model.eval()
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
