"""S2 inside a transformers 4.41 / 4.42 environment: the release's own Qwen2 flash-attention path.

transformers 4.37–4.41 ``Qwen2Model.forward`` raises a ``ValueError`` ("... padding_side='right' ...")
when ``attn_implementation == "flash_attention_2"``, ``use_cache`` is true and the batch is right-padded;
4.42 removed the check for Qwen2. This adapter runs each release's own code far enough to hit it.

On a CPU ``from_pretrained(attn_implementation="flash_attention_2")`` refuses (no CUDA flash-attn), and
the modeling module only binds the flash-attn kernels when flash-attn and CUDA are present. So the model
is built with eager attention, each layer's attention is replaced by the release's own
``Qwen2FlashAttention2`` (same weights), the model is switched to ``"flash_attention_2"``, and the
kernel names the module would have imported from flash-attn are bound to the STAND-IN package
``workbench/peers/standins/flash_attn`` (exact sdpa equivalents; reported in the output). In 4.41 the
check raises before any kernel runs; in 4.42 the forward runs through the stand-in kernels, and its
logits are compared with the eager model's on the real tokens (stand-in exactness).
"""

from __future__ import annotations

import copy

import torch

from workbench.peers import protocol

KERNEL_NAMES = ("flash_attn_func", "flash_attn_varlen_func")
PADDING_NAMES = ("index_first_axis", "pad_input", "unpad_input")


def import_peer():
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401


def flash_model(eager):
    """A copy of ``eager`` running the release's own Qwen2FlashAttention2 layers on stand-in kernels."""
    import flash_attn  # flash_attn: CUDA machines only
    import flash_attn.bert_padding as padding  # flash_attn: CUDA machines only
    from transformers.models.qwen2 import modeling_qwen2  # transformers: seconds to import; loaded where a model is

    for name in KERNEL_NAMES:
        setattr(modeling_qwen2, name, getattr(flash_attn, name))
    for name in PADDING_NAMES:
        setattr(modeling_qwen2, name, getattr(padding, name))
    modeling_qwen2._flash_supports_window_size = True
    model = copy.deepcopy(eager)
    model.config._attn_implementation = "flash_attention_2"
    for i, layer in enumerate(model.model.layers):
        attention = modeling_qwen2.Qwen2FlashAttention2(model.config, layer_idx=i)
        attention.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = attention.eval()
    model.model._attn_implementation = "flash_attention_2"
    return model.eval()


def batches(tokenizer, texts=("12+34=46", "5*5=25", "1+2=3")):
    out = {}
    for side in ("right", "left"):
        tokenizer.padding_side = side
        out[side] = tokenizer(list(texts), return_tensors="pt", padding=True)
    return out


def forward(model, batch, use_cache=True) -> tuple[bool, str, torch.Tensor | None]:
    try:
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=use_cache).logits
        return False, "", logits
    except ValueError as exc:
        return True, str(exc), None


def probes(args) -> list[dict]:
    import flash_attn  # flash_attn: CUDA machines only
    import transformers  # transformers: seconds to import; loaded where a model is

    tokenizer = protocol.load_tokenizer()
    eager = protocol.load_model(attn_implementation="eager")
    flash = flash_model(eager)
    data = batches(tokenizer)
    rows = []
    for side, batch in data.items():
        raised, message, logits = forward(flash, batch, use_cache=True)
        gap = None
        if logits is not None:
            with torch.no_grad():
                reference = eager(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
            real = batch["attention_mask"].bool()
            gap = float((logits - reference).abs()[real].max())
        no_cache_raised, _, _ = forward(flash, batch, use_cache=False)
        rows.append(protocol.audit_row(
            "s2_flash_right_padding" if side == "right" else "s2_flash_left_padding", None,
            padding_side=side, raised=raised, message=message[:160], raised_without_cache=no_cache_raised,
            max_abs_logit_gap_vs_eager=gap, kernels="stand-in flash_attn (sdpa equivalents)",
            standin_file=flash_attn.__file__, transformers=transformers.__version__))
    return rows


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["transformers"])
