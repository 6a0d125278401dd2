"""The peer side of the JSON exchange, and what every adapter needs inside a peer's environment.

An adapter is run as ``<env>/bin/python -m workbench.peers.adapters.<name> '<json args>'`` with this
repository on ``PYTHONPATH``. It imports only the peer, torch, the standard library, ``workbench.audit``
and this module (which imports only torch and the standard library at module level), so it runs
under transformers 4.41 as well as 5.23. It prints one JSON object on its last stdout line:

``{"status": "ok" | "skipped" | "error", "reason": str, "environment": {...}, "rows": [...]}``

A row is ``{"probe": id, "measured": {...numbers...}, "audit": AuditResult.to_dict() | None}``; the
host turns rows into verdicts (``workbench.peers.expectations``). A peer that cannot be imported is
``skipped`` with the import error, never a verdict.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from importlib import metadata
from pathlib import Path

import torch

from workbench.core.jsonsafe import jsonable

MARKER = "@@peer-json@@ "
CHECKPOINTS = Path(__file__).resolve().parents[2] / "data" / "checkpoints"


def emit(payload: dict) -> None:
    """Print the payload as the marked last line of stdout (peers print their own chatter before it)."""
    sys.stdout.flush()
    print(MARKER + json.dumps(jsonable(payload)), flush=True)


def environment(*packages: str) -> dict:
    """Versions of the given packages and every stand-in module that is imported (visible in the table)."""
    # versions only, never paths: these dicts end up in metrics.json and the shareable run report
    info = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in packages:
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    standins = {name: str(getattr(mod, "__version__", "stand-in")) for name, mod in list(sys.modules.items())
                if getattr(mod, "__dict__", {}).get("STANDIN") is True}
    info["standins"] = standins
    return info


def run_adapter(import_peer, probes, packages) -> None:
    """``import_peer()`` imports the peer (an exception = skipped); ``probes(args)`` returns the rows."""
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    torch.manual_seed(int(args.get("seed", 0)))
    try:
        import_peer()
    except Exception as exc:  # noqa: BLE001 - any import failure means the peer cannot run here
        emit({"status": "skipped", "reason": f"cannot import the peer: {type(exc).__name__}: {exc}",
              "environment": environment(*packages), "rows": []})
        return
    try:
        rows = probes(args)
    except Exception as exc:  # noqa: BLE001 - reported, the host marks every row of this peer as an error
        emit({"status": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:],
              "environment": environment(*packages), "rows": []})
        return
    emit({"status": "ok", "reason": "", "environment": environment(*packages), "rows": rows})


def audit_row(probe: str, result, **measured) -> dict:
    return {"probe": probe, "measured": measured, "audit": result.to_dict() if result is not None else None}


# ---------------------------------------------------------------- models with the peer's own transformers


def load_tokenizer(name: str = "tiny-arith-qwen2", padding_side: str = "left"):
    """The shipped character tokenizer through the peer's transformers (its config names a 5.x class)."""
    from transformers import PreTrainedTokenizerFast  # transformers: seconds to import; loaded where a model is

    folder = CHECKPOINTS / name
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="<unk>", padding_side=padding_side)
    return tokenizer


def load_config(name: str = "tiny-arith-qwen2", **overrides):
    """The shipped config read by the peer's transformers (5.x field names mapped back for 4.x)."""
    from transformers import AutoConfig  # transformers: seconds to import; loaded where a model is

    raw = json.loads((CHECKPOINTS / name / "config.json").read_text())
    rope = raw.pop("rope_parameters", None) or {}
    if "rope_theta" in rope:
        raw.setdefault("rope_theta", rope["rope_theta"])
    raw.pop("layer_types", None)
    raw["torch_dtype"] = raw.pop("dtype", "float32")
    raw.update(overrides)
    model_type = raw.pop("model_type")
    raw.pop("architectures", None)
    raw.pop("transformers_version", None)
    return AutoConfig.for_model(model_type, **raw)


def load_model(name: str = "tiny-arith-qwen2", cls=None, **config_overrides):
    """The shipped tiny checkpoint in the peer's own model class (safetensors weights, no hub)."""
    from safetensors.torch import load_file  # safetensors: only when a checkpoint is written
    from transformers import AutoModelForCausalLM  # transformers: seconds to import; loaded where a model is

    config = load_config(name, **config_overrides)
    cls = cls or AutoModelForCausalLM
    model = cls.from_config(config)
    state = load_file(str(CHECKPOINTS / name / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embedding
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {name} does not fit this transformers' {type(model).__name__}: "
                           f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def save_model_folder(model, tokenizer, folder: str) -> str:
    """Save with the peer's own ``save_pretrained`` (what its trainers load from a path)."""
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def import_module(name: str):
    return importlib.import_module(name)


# ---------------------------------------------------------------- driving a GRPO loss with arbitrary token losses


def k3_inverse(y: torch.Tensor) -> torch.Tensor:
    """d >= 0 with exp(d) - d - 1 = y (y >= 0), by Newton's method in float64."""
    y = y.double().clamp_min(0)
    d = torch.sqrt(2 * y) + y / 3
    for _ in range(60):
        f = torch.expm1(d) - d - y
        d = torch.where(d > 0, d - f / torch.expm1(d).clamp_min(1e-300), d)
    return d.clamp_min(0)


def grpo_inputs_for_token_losses(per_token_loss: torch.Tensor, per_token_logps: torch.Tensor, beta: float):
    """Advantages and reference log-probs that make a GRPO loss at ratio 1 have these per-token losses.

    At ratio 1 a GRPO per-token loss is −A_i + β·k3(ref − logp) with k3(d) = e^d − d − 1. With
    A_i = −min_t L_it the remainder y = L + A is ≥ 0 and ref = logp + k3⁻¹(y/β) produces it exactly
    (y = 0, hence ref = logp, for the row-constant losses of the S5 probe).
    """
    loss = per_token_loss.double()
    advantages = -loss.min(dim=1).values
    y = loss + advantages[:, None]
    if beta == 0:
        if y.abs().max() > 0:
            raise ValueError("with beta = 0 a GRPO loss at ratio 1 is constant along each row")
        return advantages.float(), per_token_logps.detach().clone()
    ref = per_token_logps.detach().double() + k3_inverse(y / beta)
    return advantages.float(), ref.to(per_token_logps.dtype)
