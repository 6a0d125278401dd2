"""Benchmarks: workbench trainers vs TRL on the same tiny model, data and hyper-parameters (CPU, fp32).

    python benchmarks/run.py --quick      # < 1 minute
    python benchmarks/run.py              # more steps and repeats

Each side runs in its own fresh Python process (so peak memory is measured per side); inside it
the trainer is built ``--repeats`` times and timed over ``--steps`` steps after one warm-up step.
Printed: one line per comparison ending in the ratio workbench/TRL of the median steps/s. Also the
EOS-stopping saving and the packed-vs-padded scoring speedup. Results can be appended to
benchmarks/RESULTS.md with ``--write``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
# the shared hyper-parameters of a comparison
GRPO = dict(prompts=2, num_generations=8, max_new_tokens=8, learning_rate=1e-5)
DPO = dict(batch_size=8, learning_rate=1e-5, beta=0.1)
# one scoring call at a real vocabulary (Qwen2.5's), random weights built from a config
MEMORY = dict(vocab_size=151936, rows=4, tokens=256)


def _timed(step_fn, steps: int) -> float:
    step_fn()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step_fn()
    return steps / (time.perf_counter() - start)


def _train_with_clock(trainer) -> list[float]:
    """Run a transformers/TRL trainer and return the wall-clock time at the end of every step."""
    from transformers import TrainerCallback

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            times.append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
    return times


def worker(kind: str, steps: int, repeats: int) -> dict:
    import torch

    from workbench.models import load
    from workbench.tasks import TRAIN_PREFERENCES, load_preferences, rl_problems

    torch.manual_seed(0)
    policy0, tokenizer = load("tiny-arith-qwen2")
    folder = tempfile.mkdtemp()
    policy0.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rates, extra = [], {}
    for repeat in range(repeats):
        if kind == "grpo-workbench":
            from workbench.trainers.grpo import GRPOConfig, GRPOTrainer

            model, tok = load(folder)
            trainer = GRPOTrainer(model, tok, rl_problems(64), GRPOConfig(
                steps=10**6, prompts_per_step=GRPO["prompts"], num_generations=GRPO["num_generations"],
                max_new_tokens=GRPO["max_new_tokens"], learning_rate=GRPO["learning_rate"], progress=False, seed=repeat))
            state = {"step": 0, "tokens": 0}

            def step():
                out = trainer.train_step(state["step"])
                state["step"] += 1
                state["tokens"] += out["response_length"] * GRPO["prompts"] * GRPO["num_generations"]
                extra.setdefault("rewards", []).append(out["reward"])

            rates.append(_timed(step, steps))
            extra["tokens_per_step"] = state["tokens"] / state["step"]
        elif kind == "grpo-trl":
            from datasets import Dataset
            from trl import GRPOConfig, GRPOTrainer

            from workbench.tasks import reward

            problems = {p.prompt: p for p in rl_problems(64)}

            def reward_fn(prompts, completions, **kw):
                return [reward(c.split(tok_eos)[0] if tok_eos in c else c, True, problems[p]) for p, c in zip(prompts, completions, strict=False)]

            tok_eos = tokenizer.eos_token
            args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none", logging_steps=10**6,
                              per_device_train_batch_size=GRPO["prompts"] * GRPO["num_generations"],
                              num_generations=GRPO["num_generations"], max_completion_length=GRPO["max_new_tokens"],
                              learning_rate=GRPO["learning_rate"], max_steps=steps + 1, beta=0.0, loss_type="grpo",
                              save_strategy="no", seed=repeat, disable_tqdm=True, temperature=1.0)
            trainer = GRPOTrainer(model=folder, reward_funcs=reward_fn, args=args, processing_class=tokenizer,
                                  train_dataset=Dataset.from_list([{"prompt": p} for p in problems] * 8))
            times = _train_with_clock(trainer)
            rates.append((len(times) - 1) / (times[-1] - times[0]))
            history = [h for h in trainer.state.log_history if "completions/mean_length" in h]
            if history:
                extra["tokens_per_step"] = history[-1]["completions/mean_length"] * GRPO["prompts"] * GRPO["num_generations"]
        elif kind == "dpo-workbench":
            from workbench.trainers.dpo import DPOConfig, DPOTrainer

            model, tok = load(folder)
            trainer = DPOTrainer(model, tok, load_preferences(TRAIN_PREFERENCES)[:512], DPOConfig(
                steps=10**6, batch_size=DPO["batch_size"], learning_rate=DPO["learning_rate"], beta=DPO["beta"], progress=False, seed=repeat))
            state = {"step": 0}

            def step():
                out = trainer.train_step(state["step"])
                state["step"] += 1
                extra.setdefault("losses", []).append(out["loss"])

            rates.append(_timed(step, steps))
        elif kind == "dpo-trl":
            from datasets import Dataset
            from trl import DPOConfig, DPOTrainer

            pairs = [{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in load_preferences(TRAIN_PREFERENCES)[:512]]
            args = DPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                             per_device_train_batch_size=DPO["batch_size"], learning_rate=DPO["learning_rate"], beta=DPO["beta"],
                             max_steps=steps + 1, save_strategy="no", seed=repeat, disable_tqdm=True)
            trainer = DPOTrainer(model=folder, args=args, train_dataset=Dataset.from_list(pairs), processing_class=tokenizer)
            times = _train_with_clock(trainer)
            rates.append((len(times) - 1) / (times[-1] - times[0]))
            extra["losses"] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        else:
            raise ValueError(kind)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    summary = {"kind": kind, "steps_per_s": rates, "median_steps_per_s": statistics.median(rates), "peak_rss_mb": peak_mb}
    if "tokens_per_step" in extra:
        summary["tokens_per_s"] = extra["tokens_per_step"] * summary["median_steps_per_s"]
    for key in ("rewards", "losses"):
        if key in extra and extra[key]:
            summary[f"{key}_range"] = [min(extra[key]), max(extra[key])]
    return summary


def _naive_scoring(model, input_ids, attention_mask):
    """The scorer before chunking: full logits, upcast whole, a full log-softmax for the entropy."""
    import torch
    import torch.nn.functional as F

    from workbench.scoring import forward

    logits = forward(model, input_ids, attention_mask)[:, :-1].float()
    logprobs = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        log_probs = F.log_softmax(logits.detach(), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logprobs, entropy


def _peak_mb(fn, device: str) -> float:
    """Peak memory (MB) above what was held before ``fn()`` ran: the CUDA allocator's peak on a GPU,
    the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) on a CPU."""
    import re

    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20

    def status(field):
        return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024

    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    fn()
    return status("VmHWM") - before


def memory_worker(device: str) -> dict:
    """Peak memory of one scoring call (log-probs + entropy, no gradient) and of one training call
    (log-probs, backward) on a random Qwen2 with Qwen2.5's 151,936-token vocabulary: naive vs chunked."""
    import torch

    from workbench.models import tiny_model
    from workbench.scoring import token_logprobs

    model, _ = tiny_model("qwen2", vocab_size=MEMORY["vocab_size"], seed=0)
    model.to(device)
    rows, tokens = MEMORY["rows"], MEMORY["tokens"]
    ids = torch.randint(4, MEMORY["vocab_size"], (rows, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones_like(ids)
    paths = {"naive": _naive_scoring, "chunked": lambda m, i, k: token_logprobs(m, i, k, with_entropy=True)}
    out = {"rows": rows, "tokens": tokens, "vocab_size": MEMORY["vocab_size"]}
    for name, fn in paths.items():
        def scoring(fn=fn):
            with torch.no_grad():
                fn(model, ids, mask)

        def training(fn=fn):
            fn(model, ids, mask)[0].sum().backward()

        fn(model, ids[:, :8], mask[:, :8])[0].sum().backward()  # warm-up: kernels, gradient buffers
        out[f"{name}_scoring_mb"] = _peak_mb(scoring, device)
        model.zero_grad(set_to_none=False)
        out[f"{name}_training_mb"] = _peak_mb(training, device)
    return out


def run_worker(kind: str, steps: int, repeats: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", kind, "--steps", str(steps), "--repeats", str(repeats)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def extras(quick: bool) -> dict:

    from workbench.diagnostics.eos import generation_cost, rollout_pair
    from workbench.diagnostics.padding import scoring_throughput
    from workbench.models import load, tiny_model
    from workbench.tasks import TEST_PROMPTS, load_problems

    model, tokenizer = load("tiny-arith-qwen2")
    prompts = [p.prompt for p in load_problems(TEST_PROMPTS)[:64]]
    pair = rollout_pair(model, tokenizer, prompts, max_new_tokens=32)
    bug, fix = generation_cost(pair["bug"]), generation_cost(pair["fix"])
    import random

    rng = random.Random(0)
    lengths = [rng.choice([8, 16, 32, 64, 128, 200]) for _ in range(32)]
    ragged = [[1] + [rng.randrange(4, 64) for _ in range(n - 1)] for n in lengths]
    tiny, _ = tiny_model("qwen2")
    padded = scoring_throughput(tiny, ragged, packed=False, pad_token_id=0, repeats=3 if quick else 7)
    packed = scoring_throughput(tiny, ragged, packed=True, pad_token_id=0, repeats=3 if quick else 7)
    return {"eos_time_ratio": bug["seconds"] / fix["seconds"], "eos_tokens_bug": bug["tokens_generated"], "eos_tokens_fix": fix["tokens_generated"],
            "packed_speedup": packed / padded, "padded_tok_s": padded, "packed_tok_s": packed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help="append the results to benchmarks/RESULTS.md")
    args = parser.parse_args()
    steps = args.steps or (20 if args.quick else 40)
    repeats = args.repeats or 3
    if args.worker == "memory":
        print(json.dumps(memory_worker(args.device)))
        return 0
    if args.worker:
        print(json.dumps(worker(args.worker, steps, repeats)))
        return 0
    start = time.perf_counter()
    lines, results = [], {}
    for name in ("grpo", "dpo"):
        ours, theirs = run_worker(f"{name}-workbench", steps, repeats), run_worker(f"{name}-trl", steps, repeats)
        results[name] = {"workbench": ours, "trl": theirs}
        ratio = ours["median_steps_per_s"] / theirs["median_steps_per_s"]
        tokens = (f", generated tok/s {ours.get('tokens_per_s', 0):.0f} vs {theirs.get('tokens_per_s', 0):.0f}"
                  if name == "grpo" else "")
        ranges = f", {'reward' if name == 'grpo' else 'loss'} range " + (
            f"{ours.get('rewards_range', ours.get('losses_range'))} vs {theirs.get('losses_range', '—')}" if name == "dpo"
            else f"{[round(v, 3) for v in ours.get('rewards_range', [])]}")
        lines.append(f"{name.upper()}: workbench {ours['median_steps_per_s']:.2f} steps/s vs TRL {theirs['median_steps_per_s']:.2f} steps/s"
                     f"{tokens}, peak RSS {ours['peak_rss_mb']:.0f} vs {theirs['peak_rss_mb']:.0f} MB{ranges} → ratio {ratio:.2f}×")
    extra = extras(args.quick)
    lines.append(f"EOS stopping: {extra['eos_tokens_bug']} → {extra['eos_tokens_fix']} tokens for 64 responses, rollout time ratio → {extra['eos_time_ratio']:.2f}×")
    lines.append(f"Packed vs padded scoring (32 ragged sequences, 8–200 tokens): {extra['padded_tok_s']:.0f} → {extra['packed_tok_s']:.0f} tok/s → {extra['packed_speedup']:.2f}×")
    for line in lines:
        print(line)
    elapsed = time.perf_counter() - start
    print(f"({elapsed:.0f} s, {steps} timed steps × {repeats} repeats per side)")
    if args.write:
        with open(HERE / "RESULTS.md", "a") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — {'quick' if args.quick else 'full'} run\n\n")
            f.write(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
                    f"torch {__import__('torch').__version__}, transformers {__import__('transformers').__version__}, trl {__import__('trl').__version__}\n\n")
            for line in lines:
                f.write(f"- {line}\n")
            f.write(f"\nSettings: GRPO {GRPO}, DPO {DPO}; {steps} timed steps × {repeats} repeats per side, median reported.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
