"""What the workbench does on a CUDA GPU, measured: attention back-ends' log-prob gaps and the trainers' step-0 invariances.

    python scripts/gpu_check.py --out gpu_check.json      # needs a CUDA GPU; about a minute

Why: the CPU test suite cannot run the CUDA paths (bf16 autocast on CUDA, PyTorch's fused attention
kernels, device generators for sampling, stop ids on the GPU). This script runs them on the realistic
checkpoints (``workbench.modeling.realistic``: GPT-2-, Qwen2- and Llama-like, built locally in seconds) and
prints, then writes as JSON:

1. **the machine**: GPU, driver, CUDA, torch, transformers, whether flash-attn is importable;
2. **attention back-ends**: the response log-probs of the same sequences under eager attention,
   ``sdpa`` (PyTorch picks the kernel), ``sdpa`` restricted to each of its kernels (math, memory-
   efficient, flash), and ``flash_attention_2`` when flash-attn is importable, in fp32 and bf16, each
   against the fp32 eager reference: max and mean |Δ log p| over response tokens. Two layouts: each
   sequence alone (no padding: the flash kernel is eligible) and a left-padded batch (a padding mask:
   PyTorch's flash kernel is not eligible and sdpa falls back);
3. **the sampler's decode paths on CUDA**: ``rollout.sample`` with ``static_cache=True`` (``modeling.decode.StaticDecoder``,
   the trainers' default) against ``model(...)`` per token, and ``cuda_graph=True`` (``modeling.graphed_decode``)
   against the static decoder, same seed, on a left-padded batch and on groups of one prompt (shared prefill), in fp32
   and bf16: whether the tokens are equal, the largest log-prob gap, each side's time, and whether a graph was
   recorded (and would be under ``bf16-mixed``'s autocast: it is refused there);
4. **gradients**: the summed response log-probs' gradient per parameter group (attention, MLP,
   embeddings, norms) under each back-end in bf16 and each layout (alone, left-padded, packed), as the relative
   L2 distance from fp32 eager's — the forward gaps above cannot see a wrong backward (flash-attn 4 at head dim 16:
   docs/GPU.md; ``core.attention_backward.MEASURED_BACKWARD``). ``--head-dims 64,128`` adds realistic-qwen2 rebuilt at
   those head dims;
5. **kernels**: each installed flash package's own functions, called directly in bf16, forward and backward, against
   fp32 sdpa on the same draw: the dense kernel and the variable-length one (two sequences across a 128-token tile,
   and the 16 sequences of the gradients section), contiguous and transposed inputs, GQA, head dims 16-128 — relative
   errors of the output and of dq/dk/dv, bf16 sdpa's beside them. This separates a kernel's backward from
   transformers' integration of it. ``--kernel-map`` runs the grid that fills ``core.attention_backward``'s table
   instead: head dims 8-256 × 4, 2 and 1 key/value heads for 4 query heads × dense and variable-length, and 2048-token
   sequences at 16, 64 and 128 (about 10 minutes on an H100: a CuTe-DSL compile per configuration);
6. **trainers on CUDA**: one step of PPO, GRPO and DPO per precision (``fp32``, ``bf16-mixed``,
   ``bf16``) on each realistic checkpoint with the default switches: ρ − 1, KL and clip fraction at
   step 0 must be exactly 0, DPO's step-0 margins exactly 0 (the invariances of
   ``tests/trainers/test_invariances.py``, here on the GPU), with each step's wall time.

Nothing here is a test (CI has no GPU); ``docs/journal/`` records what it printed, with the machine;
``docs/GPU.md`` gives the current figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import itertools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.core.batching import pad_sequences  # noqa: E402
from workbench.experiments import checkpoints
from workbench.modeling import realistic  # noqa: E402
from workbench.modeling.attention import FLASH_BACKENDS, available_flash_backends, flash_attention_status  # noqa: E402
from workbench.modeling.models import load_tokenizer  # noqa: E402
from workbench.modeling.rollout import rollout_agreement  # noqa: E402
from workbench.modeling.scoring import response_logprobs  # noqa: E402
from workbench.tasks import rl_problems  # noqa: E402

CHECKPOINTS = ("realistic-gpt2", "realistic-qwen2", "realistic-llama")
DEVICE = "cuda"  # --device cpu: a dry run of this script on a machine without a GPU


def machine() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip()
    import transformers

    return {"gpu": smi, "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "python": platform.python_version(), "flash_attn_importable": importlib.util.find_spec("flash_attn") is not None,
            "flash_backends": {name: flash_attention_status(name)[1] for name in FLASH_BACKENDS},
            "capability": ".".join(map(str, torch.cuda.get_device_capability()))}


def backends() -> dict:
    """Attention set-ups: (attn_implementation, PyTorch sdpa kernel or None for PyTorch's choice)."""
    from torch.nn.attention import SDPBackend

    chosen = {"eager": ("eager", None), "sdpa": ("sdpa", None), "sdpa/math": ("sdpa", SDPBackend.MATH),
              "sdpa/efficient": ("sdpa", SDPBackend.EFFICIENT_ATTENTION), "sdpa/flash": ("sdpa", SDPBackend.FLASH_ATTENTION)}
    for flash in available_flash_backends():  # flash-attn 2 and/or flash-attn 4, where installed and runnable
        chosen[flash] = (flash, None)
    return chosen


def sequences(tokenizer, n: int = 16, response_tokens: int = 12):
    """n prompts of different lengths with a fixed pseudo-response each (token ids, not sampled)."""
    generator = torch.Generator().manual_seed(0)
    prompts = [tokenizer(p.prompt * (1 + i % 4), add_special_tokens=False)["input_ids"] for i, p in enumerate(rl_problems(n))]
    vocab = min(len(tokenizer), 200)
    responses = [torch.randint(3, vocab, (response_tokens,), generator=generator).tolist() for _ in prompts]
    return prompts, responses


def score(model, prompts, responses, filler: int, layout: str) -> list[torch.Tensor]:
    """Per-sequence response log-probs (fp32, CPU) in ``layout``: "alone", "padded" (left-padded batch) or "packed"
    (the same batch padding-free: ``packed=True``, one row under a flash back-end, i.e. its variable-length kernel;
    bin-packed rows under a block-diagonal mask otherwise)."""
    device = model.device
    if layout == "alone":
        out = []
        for prompt, response in zip(prompts, responses, strict=True):
            ids, mask = torch.tensor([prompt], device=device), torch.ones(1, len(prompt), dtype=torch.long, device=device)
            rid, rmask = torch.tensor([response], device=device), torch.ones(1, len(response), dtype=torch.long, device=device)
            out.append(response_logprobs(model, ids, mask, rid, rmask).float().cpu()[0])
        return out
    ids, mask = (t.to(device) for t in pad_sequences(prompts, filler, side="left"))
    rid = torch.tensor(responses, device=device)
    logp = response_logprobs(model, ids, mask, rid, torch.ones_like(rid), packed=layout == "packed").float().cpu()
    return list(logp)


def attention_gaps(name: str) -> dict:
    """max / mean |Δ log p| of every (back-end, dtype, layout) against fp32 eager, same layout."""
    results = {}
    for layout in ("alone", "padded", "packed"):
        reference = None
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            for label, (implementation, kernel) in backends().items():
                model, tokenizer = checkpoints.load(name, dtype=dtype, attn_implementation=implementation, device=DEVICE)
                prompts, responses = sequences(tokenizer)
                filler = tokenizer.pad_token_id
                context = contextlib.nullcontext()
                if kernel is not None:
                    from torch.nn.attention import sdpa_kernel

                    context = sdpa_kernel([kernel])
                key = f"{layout}/{dtype_name}/{label}"
                try:
                    with context, torch.no_grad():
                        values = torch.cat(score(model, prompts, responses, filler, layout))
                except Exception as error:  # a kernel not eligible for this layout or dtype (flash: no fp32)
                    results[key] = {"error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"}
                    continue
                if reference is None:  # fp32 eager comes first
                    reference = values
                gap = (values - reference).abs()
                results[key] = {"max_abs": float(gap.max()), "mean_abs": float(gap.mean())}
    return results


def decode_paths(name: str) -> dict:
    """``static_cache`` True vs False on CUDA: same tokens? max |Δ log p| of the sampled tokens, and each side's seconds
    (after one warm-up call each)."""
    from workbench.modeling.decode import unsupported_reason
    from workbench.modeling.graphed_decode import capturable
    from workbench.modeling.rollout import sample
    from workbench.tasks import encode_prompts

    out = {}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model, tokenizer = checkpoints.load(name, dtype=dtype, attn_implementation="sdpa", device=DEVICE)
        model.eval()
        reason = unsupported_reason(model)
        texts = [p.prompt for p in rl_problems(8)]
        for layout, prompts, share in (("padded", texts, False), ("groups", [t for t in texts[:4] for _ in range(8)], True)):
            key = f"{dtype_name}/{layout}"
            if reason is not None:
                out[key] = {"static_decoder": f"not used: {reason}"}
                continue
            ids, mask = (t.to(DEVICE) for t in encode_prompts(tokenizer, prompts))

            def run(side, ids=ids, mask=mask, share=share, model=model, tokenizer=tokenizer):
                generator = torch.Generator(device=DEVICE).manual_seed(5)
                with torch.inference_mode():
                    return sample(model, ids, mask, max_new_tokens=32, eos_token_id=tokenizer.eos_token_id,
                                  pad_token_id=tokenizer.pad_token_id, generator=generator, share_prefill=share,
                                  static_cache=side != "plain", cuda_graph=side == "graphed")

            try:
                timed = {}
                for side in ("plain", "static", "graphed"):
                    run(side)  # warm-up
                    synchronize()
                    start = time.perf_counter()
                    rollout = run(side)
                    synchronize()
                    timed[side] = (rollout, time.perf_counter() - start)
                out[key] = {**rollout_agreement(timed["plain"][0], timed["static"][0]),
                            "graphed_vs_static": rollout_agreement(timed["static"][0], timed["graphed"][0]),
                            "graph_recorded": capturable(model),  # False on a CPU: cuda_graph is ignored there
                            **{f"seconds_{side}": seconds for side, (_, seconds) in timed.items()}}
                with torch.autocast(DEVICE, dtype=torch.bfloat16):  # precision="bf16-mixed": graphs refused (not verified)
                    out[key]["graph_under_autocast"] = capturable(model)
            except Exception as error:  # recorded, not hidden
                out[key] = {"error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"}
    return out


# parameter groups by name fragments (Llama/Qwen2 and GPT-2 names)
GROUPS = {"attention": ("self_attn.", "attn."), "mlp": ("mlp.",), "embeddings": ("embed", "wte", "wpe"), "norms": ("norm", "ln_")}


def _gradients(name: str, implementation: str, dtype, layout: str) -> dict[str, torch.Tensor]:
    model, tokenizer = checkpoints.load(name, dtype=dtype, attn_implementation=implementation, device=DEVICE)
    model.eval()  # dropout off (GPT-2's config has 0.1): the same function on every side; gradients flow in eval mode too
    prompts, responses = sequences(tokenizer)
    if layout == "alone":
        for prompt, response in zip(prompts, responses, strict=True):
            ids, rid = torch.tensor([prompt], device=DEVICE), torch.tensor([response], device=DEVICE)
            response_logprobs(model, ids, torch.ones_like(ids), rid, torch.ones_like(rid)).float().sum().backward()
    else:
        ids, mask = (t.to(DEVICE) for t in pad_sequences(prompts, tokenizer.pad_token_id, side="left"))
        rid = torch.tensor(responses, device=DEVICE)
        response_logprobs(model, ids, mask, rid, torch.ones_like(rid), packed=layout == "packed").float().sum().backward()
    return {n: p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32) for n, p in model.named_parameters()}


def gradient_gaps(name: str) -> dict:
    """Per parameter group, ‖g − g_ref‖ / ‖g_ref‖ of each (back-end, layout) in bf16 against fp32 eager, same layout."""
    results = {}
    for layout in ("alone", "padded", "packed"):
        reference = _gradients(name, "eager", torch.float32, layout)
        groups = {g: [n for n in reference if any(f in n for f in fragments)] for g, fragments in GROUPS.items()}
        grouped = {n for names in groups.values() for n in names}
        groups["other"] = [n for n in reference if n not in grouped]  # e.g. an untied LM head
        for implementation in ("eager", "sdpa", *available_flash_backends()):
            key = f"{layout}/bf16/{implementation}"
            try:
                grads = _gradients(name, implementation, torch.bfloat16, layout)
            except Exception as error:  # recorded, not hidden
                results[key] = {"error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"}
                continue
            results[key] = {g: float(torch.cat([(grads[n] - reference[n]).reshape(-1) for n in names]).norm()
                                     / torch.cat([reference[n].reshape(-1) for n in names]).norm())
                            for g, names in groups.items() if names}
    return results


def head_dim_variant(head_dim: int, folder: Path) -> Path:
    """realistic-qwen2 rebuilt with ``head_dim`` (4 query and 2 key/value heads, hidden 4 × head_dim; random weights, seed 0)
    in ``folder``: the gradients section at the head dims of real checkpoints (Qwen2.5-0.5B's is 64), not only 16."""
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer("realistic-qwen2")  # as shipped, as realistic.write_checkpoint saves it
    config = realistic.build_config(realistic.spec_of("qwen2"), tokenizer, hidden=4 * head_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = realistic.generation_config(realistic.spec_of("qwen2"), tokenizer)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    return folder


def _flash_functions(backend: str):
    """(dense, variable-length) attention functions of a flash package, as it exports them."""
    if backend == "flash_attention_4":
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    else:
        from flash_attn import flash_attn_func, flash_attn_varlen_func
    return flash_attn_func, flash_attn_varlen_func


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


LONG_LENGTHS = (100, 156)  # a variable-length row of two sequences, the second across a 128-token tile


def model_lengths(name: str = "realistic-qwen2") -> tuple[int, ...]:
    """The sequence lengths (prompt + response) of the gradients section's batch on ``name``: 16 sequences of 17-36 tokens."""
    prompts, responses = sequences(load_tokenizer(name))
    return tuple(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))


def kernel_map_cases(lengths: tuple[int, ...]) -> dict:
    """``--kernel-map``: every head dim FA4 accepts of 8-256 × key/value heads 4, 2, 1 (for 4 query heads) × dense (2 × 96
    tokens) and variable-length (``lengths``), and 2048-token sequences (one dense row; five variable-length ones up to 2048)
    at head dims 16, 64 and 128."""
    cases = {}
    for head_dim in (8, 16, 24, 32, 48, 64, 80, 96, 128, 192, 256):
        for kv_heads in (4, 2, 1):
            cases[f"dense hd{head_dim} 4q/{kv_heads}kv"] = (4, kv_heads, head_dim, (2, 96))
            cases[f"varlen hd{head_dim} 4q/{kv_heads}kv"] = (4, kv_heads, head_dim, lengths)
    for head_dim in (16, 64, 128):
        for kv_heads in (4, 2):
            cases[f"dense T2048 hd{head_dim} 4q/{kv_heads}kv"] = (4, kv_heads, head_dim, (1, 2048))
            cases[f"varlen long hd{head_dim} 4q/{kv_heads}kv"] = (4, kv_heads, head_dim, (700, 1300, 333, 2048, 17))
    return cases


def kernel_gaps(functions: dict, lengths: tuple[int, ...], cases: dict | None = None) -> dict:
    """``functions``: {label: (dense, varlen)} taking flash's (tokens, heads, d) layouts. Relative errors of the output and
    of dq/dk/dv against fp32 sdpa, per case; a failing case is recorded with its error. ``lengths``: the variable-length
    row of the model-like cases (``model_lengths``). The head dims include the
    realistic checkpoints' 16 (where flash-attn 4's model-level gradients were wrong) and the 0.5B shape's 64."""
    torch.manual_seed(0)

    def sdpa_dense(q, k, v):  # (B, T, H, d) in and out; GQA by repeating key/value heads
        groups = q.shape[2] // k.shape[2]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.repeat_interleave(groups, 2).transpose(1, 2),
                                             v.repeat_interleave(groups, 2).transpose(1, 2), is_causal=True)
        return out.transpose(1, 2)

    def sdpa_varlen(q, k, v, *, lengths):  # (total, H, d): each sequence on its own
        parts, start = [], 0
        for length in lengths:
            piece = slice(start, start + length)
            parts.append(sdpa_dense(q[None, piece], k[None, piece], v[None, piece])[0])
            start += length
        return torch.cat(parts)

    def run(fn, dtype, tensors, transposed):
        leaves = [t.detach().to(dtype).clone().requires_grad_() for t in tensors]
        inputs = [t.transpose(-3, -2).contiguous().transpose(-3, -2) if transposed else t for t in leaves]  # other strides
        out = fn(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(gradient.to(dtype))
        return [out.detach(), *(torch.zeros_like(t) if t.grad is None else t.grad for t in leaves)]  # no gradient: 1.0

    cases = cases or {  # name: (heads of q, of k/v, head dim, dense (batch, tokens) or varlen lengths)
        "dense hd16 GQA 4q/2kv": (4, 2, 16, (2, 96)), "dense hd64": (4, 4, 64, (2, 96)), "dense hd128": (4, 4, 128, (2, 96)),
        "dense GQA 4q/2kv": (4, 2, 64, (2, 96)),
        "varlen hd64": (4, 4, 64, LONG_LENGTHS), "varlen GQA 4q/2kv": (4, 2, 64, LONG_LENGTHS),
        "varlen hd16 GQA 4q/2kv": (4, 2, 16, LONG_LENGTHS),
        "varlen 16 seqs hd16 GQA 4q/2kv": (4, 2, 16, lengths), "varlen 16 seqs hd32 GQA 4q/2kv": (4, 2, 32, lengths),
        "varlen 16 seqs hd64 GQA 14q/2kv": (14, 2, 64, lengths), "varlen 16 seqs hd128": (4, 4, 128, lengths),
    }
    results = {}
    for case, (q_heads, kv_heads, head_dim, extent) in cases.items():
        dense = case.startswith("dense")
        tokens = extent if dense else (sum(extent),)
        q_shape, kv_shape = (*tokens, q_heads, head_dim), (*tokens, kv_heads, head_dim)
        tensors = [torch.randn(q_shape, device=DEVICE), torch.randn(kv_shape, device=DEVICE), torch.randn(kv_shape, device=DEVICE)]
        gradient = torch.randn(q_shape, device=DEVICE)
        reference_fn = sdpa_dense if dense else functools.partial(sdpa_varlen, lengths=extent)
        reference = run(reference_fn, torch.float32, tensors, False)
        sides = {"sdpa bf16": reference_fn}
        if not dense:
            cu = torch.tensor([0, *itertools.accumulate(extent)], dtype=torch.int32, device=DEVICE)
        for label, (dense_fn, varlen_fn) in functions.items():
            sides[label] = functools.partial(dense_fn, causal=True) if dense else functools.partial(
                varlen_fn, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(extent), max_seqlen_k=max(extent), causal=True)
        for label, fn in sides.items():
            for transposed in (False, True):
                key = f"{case}/{label}/{'transposed' if transposed else 'contiguous'}"
                try:
                    got = run(fn, torch.bfloat16, tensors, transposed)
                    results[key] = {n: _relative(a, b) for n, a, b in zip(("out", "dq", "dk", "dv"), got, reference, strict=True)}
                except Exception as error:  # recorded, not hidden
                    results[key] = {"error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"}
    return results


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def trainer_step0(name: str, precision: str) -> dict:
    """One step of each trainer on CUDA under the default switches; the step-0 invariants."""
    from workbench.tasks import Problem
    from workbench.trainers.dpo import DPOConfig, DPOTrainer
    from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
    from workbench.trainers.ppo import PPOConfig, PPOTrainer

    problems = [Problem(p.prompt, p.answer) for p in rl_problems(16)]
    pairs = [{"prompt": p.prompt, "chosen": p.answer, "rejected": p.answer + "1"} for p in problems[:8]]
    out = {}
    runs = {
        "grpo": lambda m, t: GRPOTrainer(m, t, problems, GRPOConfig(
            steps=1, progress=False, prompts_per_step=4, num_generations=4, max_new_tokens=8, beta=0.1, mini_batches=2,
            num_iterations=2, precision=precision)).train()[0],
        "ppo": lambda m, t: PPOTrainer(m, t, problems, PPOConfig(
            steps=1, progress=False, prompts_per_step=8, mini_batches=2, max_new_tokens=8, precision=precision)).train()[0],
        "dpo": lambda m, t: DPOTrainer(m, t, pairs, DPOConfig(steps=1, progress=False, batch_size=4, precision=precision)).train()[0],
    }
    keys = {"grpo": ("ratio_deviation_first", "kl_first", "clip_fraction_first"),
            "ppo": ("train_ratio_deviation", "kl_token_max_abs", "clip_fraction_first"),
            "dpo": ("rewards/margins", "rewards/chosen", "rewards/rejected")}
    for kind, run in runs.items():
        model, tokenizer = checkpoints.load(name, device=DEVICE, dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
        try:
            synchronize()
            start = time.perf_counter()
            step = run(model, tokenizer)
            synchronize()
            values = {k: float(step[k]) for k in keys[kind]}
            out[kind] = {**values, "exact": all(v == 0.0 for v in values.values()), "seconds": time.perf_counter() - start}
        except Exception as error:  # recorded, not hidden: the point is to see what breaks on a GPU
            out[kind] = {"error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"}
    return out


SECTIONS = ("attention", "decode", "gradients", "kernels", "trainers")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json", help="where the JSON goes")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the script itself")
    parser.add_argument("--attention-only", action="store_true", help="the attention back-ends' gaps only (no trainer steps)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--kernel-map", action="store_true",
                        help="the kernels section runs the head-dim × key/value-head grid (about 10 minutes on an H100)")
    parser.add_argument("--head-dims", default="",
                        help="comma-separated head dims at which the gradients section also runs a rebuilt realistic-qwen2 "
                             "(e.g. 64,128; the realistic checkpoints' own is 16)")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU on this machine; run it where `torch.cuda.is_available()` is true", file=sys.stderr)
        return 2
    for flavour in ("gpt2", "qwen2", "llama"):
        realistic.checkpoint(flavour)  # built locally on first use
    sections = {"attention"} if args.attention_only else set(args.sections.split(","))
    if not sections <= set(SECTIONS):
        parser.error(f"--sections {args.sections!r}: unknown {sorted(sections - set(SECTIONS))}; choose among {', '.join(SECTIONS)}")
    report = {"machine": machine() if DEVICE == "cuda" else {"device": "cpu (dry run)"}, **{section: {} for section in SECTIONS}}
    print(json.dumps(report["machine"]), flush=True)
    if "kernels" in sections:
        functions = {flash: _flash_functions(flash) for flash in available_flash_backends()}
        lengths = model_lengths()
        cases = kernel_map_cases(lengths) if args.kernel_map else None
        report["kernels"] = kernel_gaps(functions, lengths, cases) if functions else {"skipped": "no flash package can run here"}
        for key, value in report["kernels"].items():
            print(f"kernels {key:48s} {value}", flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    for name in CHECKPOINTS:
        if "attention" in sections:
            report["attention"][name] = attention_gaps(name)
            for key, value in report["attention"][name].items():
                print(f"{name:16s} {key:28s} {value}", flush=True)
        if "decode" in sections:
            report["decode"][name] = decode_paths(name)
            for key, value in report["decode"][name].items():
                print(f"{name:16s} decode {key:14s} {value}", flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
        if "gradients" in sections:
            report["gradients"][name] = gradient_gaps(name)
            for key, value in report["gradients"][name].items():
                print(f"{name:16s} gradients {key:28s} {value}", flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
        if "trainers" not in sections:
            continue
        report["trainers"][name] = {p: trainer_step0(name, p) for p in ("fp32", "bf16-mixed", "bf16")}
        for precision, kinds in report["trainers"][name].items():
            for kind, value in kinds.items():
                print(f"{name:16s} {precision:10s} {kind:4s} {value}", flush=True)
        Path(args.out).write_text(json.dumps(report, indent=1))  # what ran so far, should a later section be cut off
    if "gradients" in sections and args.head_dims:
        import tempfile

        for head_dim in (int(h) for h in args.head_dims.split(",")):
            with tempfile.TemporaryDirectory() as folder:
                name = f"realistic-qwen2 hd{head_dim}"
                report["gradients"][name] = gradient_gaps(str(head_dim_variant(head_dim, Path(folder))))
            for key, value in report["gradients"][name].items():
                print(f"{name:16s} gradients {key:28s} {value}", flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
