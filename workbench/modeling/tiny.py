"""The tiny models: randomly initialised Llama, Qwen2, GPT-2 (and a Gemma-2-style one, P31, and a Mixtral-style MoE, P30) built
from configs, and the names of
the built-in ones (random ``tiny-<arch>`` and the shipped trained ``tiny-arith-*``, ``tiny-sums-qwen2`` and
``tiny-restate-qwen2`` checkpoints).

Small enough for a laptop CPU (~0.1M parameters, the 64-token character tokenizer). Llama and Qwen2
use rotary position embeddings (relative: a constant position shift is a no-op); GPT-2 uses learned
absolute positions (a shift changes the logits) — the contrast pitfall S1 is about.
"""

from __future__ import annotations

import torch

from workbench.core.paths import DATA_DIR
from workbench.modeling.attention import resolve_attn_implementation
from workbench.modeling.tokenizer import load_char_tokenizer

ARCHITECTURES = ("llama", "qwen2", "gpt2")
ROPE_ARCHITECTURES = ("llama", "qwen2")

# Shipped checkpoints trained by scripts/train_tiny_checkpoint.py (supervised; the tasks of tasks.registry).
TRAINED_CHECKPOINTS = {
    "tiny-arith-qwen2": DATA_DIR / "checkpoints" / "tiny-arith-qwen2",
    "tiny-arith-gpt2": DATA_DIR / "checkpoints" / "tiny-arith-gpt2",
    "tiny-sums-qwen2": DATA_DIR / "checkpoints" / "tiny-sums-qwen2",
    "tiny-restate-qwen2": DATA_DIR / "checkpoints" / "tiny-restate-qwen2",
    # head_dim 32 (3 heads × 32, hidden 96): the shapes vLLM's CPU attention accepts (``workbench.engines``)
    "tiny-arith-qwen2-hd32": DATA_DIR / "checkpoints" / "tiny-arith-qwen2-hd32",
    "tiny-sums-qwen2-hd32": DATA_DIR / "checkpoints" / "tiny-sums-qwen2-hd32",
    "tiny-restate-qwen2-hd32": DATA_DIR / "checkpoints" / "tiny-restate-qwen2-hd32",
}
# Gemma-2 style (final-logit soft-capping; pitfall P31) is built in but outside ARCHITECTURES, which the S1 sweeps walk.
SOFTCAP_ARCHITECTURE = "gemma2"
# Mixtral style (sparse MoE: 16 experts, top-4 renormalised, 4 layers; pitfall P30), built in on the same terms.
MOE_ARCHITECTURE = "mixtral"
EXTRA_ARCHITECTURES = (SOFTCAP_ARCHITECTURE, MOE_ARCHITECTURE)
RANDOM_BUILTINS = {f"tiny-{arch}": arch for arch in (*ARCHITECTURES, *EXTRA_ARCHITECTURES)}


def tiny_config(arch: str, **overrides):
    """The config of a tiny randomly-initialised model (~0.1M parameters, 64-token vocabulary).

    Dropout is 0 everywhere by default (dropout left on during RL is pitfall P7; pass e.g.
    ``resid_pdrop=0.1`` for GPT-2 or ``attention_dropout=0.1`` for Llama/Qwen2 to switch it on).
    """
    from transformers import (  # transformers: on use (seconds), keeps the CLI's start light
        Gemma2Config,
        GPT2Config,
        LlamaConfig,
        MixtralConfig,
        Qwen2Config,
    )

    tokenizer = load_char_tokenizer()
    special = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    hidden = overrides.pop("hidden_size", 64)
    layers = overrides.pop("num_hidden_layers", 4 if arch == MOE_ARCHITECTURE else 2)
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
    elif arch == SOFTCAP_ARCHITECTURE:
        config = Gemma2Config(  # final logits soft-capped at 30 as in Gemma 2; the attention cap (eager-only) is left off
            hidden_size=hidden,
            intermediate_size=overrides.pop("intermediate_size", 2 * hidden),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=overrides.pop("num_key_value_heads", max(1, heads // 2)),
            head_dim=overrides.pop("head_dim", hidden // heads),
            max_position_embeddings=max_positions,
            sliding_window=overrides.pop("sliding_window", max_positions),
            final_logit_softcapping=overrides.pop("final_logit_softcapping", 30.0),
            attn_logit_softcapping=overrides.pop("attn_logit_softcapping", None),
            tie_word_embeddings=overrides.pop("tie_word_embeddings", False),
            attention_dropout=overrides.pop("attention_dropout", 0.0),
            **special,
        )
    elif arch == MOE_ARCHITECTURE:
        # initializer_range 0.1, not transformers' 0.02: at 0.02 a random model's log-probs are near-uniform and an expert's
        # output is a sliver of the residual stream, so which experts a token visits barely moves its log-prob; at 0.1 the
        # log-probs spread (mean ~ −3 nats on the arithmetic prompts) and the experts carry weight, as in a trained model.
        config = MixtralConfig(
            hidden_size=hidden,
            intermediate_size=overrides.pop("intermediate_size", hidden),  # per expert
            num_local_experts=overrides.pop("num_local_experts", 16),
            num_experts_per_tok=overrides.pop("num_experts_per_tok", 4),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=overrides.pop("num_key_value_heads", max(1, heads // 2)),
            max_position_embeddings=max_positions,
            initializer_range=overrides.pop("initializer_range", 0.1),
            router_jitter_noise=overrides.pop("router_jitter_noise", 0.0),
            tie_word_embeddings=overrides.pop("tie_word_embeddings", True),
            attention_dropout=overrides.pop("attention_dropout", 0.0),
            **special,
        )
    else:
        raise ValueError(f"Unknown architecture {arch!r}; choose one of {(*ARCHITECTURES, *EXTRA_ARCHITECTURES)}")
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
    from transformers import AutoModelForCausalLM  # transformers: on use (seconds), keeps the CLI's start light

    config = tiny_config(arch, **config_overrides)
    config._attn_implementation = resolve_attn_implementation(attn_implementation, dtype)
    if arch == SOFTCAP_ARCHITECTURE:  # transformers' Gemma 2 runs eager attention only
        config._attn_implementation = "eager"
    if arch == MOE_ARCHITECTURE:  # all experts as batched matmuls: ~8× faster on a CPU than the per-expert loop ("eager")
        config._experts_implementation = "batched_mm"
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
