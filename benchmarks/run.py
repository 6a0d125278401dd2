"""Benchmarks: workbench trainers vs TRL on the same model, data and hyper-parameters, side by side.

    python benchmarks/run.py --quick      # about 3 minutes on 2 quiet CPU cores (160 s, 2026-11-27)
    python benchmarks/run.py              # more steps and repeats
    python benchmarks/run.py --device cuda --write   # the same comparisons on a GPU

Each side of a comparison runs in its own Python process, started once; both are built before any
timing starts, then the repeats alternate workbench, TRL, workbench, TRL, ... (each repeat builds a
fresh trainer from the same saved model folder, takes one warm-up step and times ``--steps``
steps), so a drift in the machine's speed hits both sides alike. On a CPU both sides run with the
same number of threads (``--threads``, default 1: on a shared 2-core machine, two OpenMP threads
that wait for each other turn small ops 10-50× slower whenever another process holds a core) and
the ratio compares the medians of steps per CPU-second of each process, which other processes on
the shared cores cannot slow down (the wall-clock steps/s are printed too); on a GPU, wall-clock
steps/s.

Printed: one line per comparison ending in ``→ N.NN×`` (workbench ÷ TRL, or the saving):

* ``GRPO:`` and ``DPO:`` — the shipped ``tiny-arith-qwen2`` (0.4M parameters), TRL 1.16 with its
  defaults; ``GRPO (TRL without gradient checkpointing)`` and ``DPO (…)`` — the same workbench runs
  against TRL with gradient checkpointing off (TRL 1.16 turns it on by default in both configs; it
  recomputes the forward in the backward pass), a third process in the same rotation;
* ``GRPO, long responses`` — the shipped ``tiny-sums-qwen2`` on the sums task (scratchpad responses of 8–37 tokens,
  the task's 48-token budget), against TRL with its defaults and without gradient checkpointing: sampling is most of
  the step there;
* ``GRPO, larger model`` — a random Qwen2 configuration of ~12M parameters with a 32k
  vocabulary, where compute rather than Python overhead dominates;
* ``Sampler`` — the workbench's decode loop (``sample`` as the trainers call it: shared prefill,
  static KV cache) vs ``model.generate`` on the same model, prompts (GRPO's groups), seed and
  sampling settings (temperature 1, no top-k/top-p), tokens per CPU-second, at the tiny size and on
  the larger model; a third side on the larger model draws by inverse CDF (``draw="inverse_cdf"``,
  other tokens for the same seed);
* ``Packed vs padded`` — scoring a ragged batch (8–200 tokens) bin-packed vs padded;
* ``Scoring memory`` — peak memory of one scoring call (log-probs + entropy) on a random Qwen2 with
  Qwen2.5's 151,936-token vocabulary, the naive full-logits path vs the chunked one;
* ``EOS stopping`` — the rollout time saved by stopping at EOS (pitfall S3);
* ``Training workers`` — the CPU-seconds of one ``train_variants`` call with 2 worker processes (every process under
  it counted), the workers spawned (fresh interpreters) vs forked from a clean copy of the calling process
  (``core.worker_processes``, what a catalogue kernel does), each call in a fresh process, rounds alternating; and
  whether the two give identical records;
* ``Watch overhead`` — the workbench's GRPO step (the ``GRPO`` configuration) without a watch, inside the light
  ``workbench.watch`` and inside the deep one, three processes alternating; time per step with ÷ without
  (target for light: ≤ 1.05×). ``--watch-only`` runs just this line; with ``--baseline DIR`` the baseline
  tree's step without and with the light watch joins the rotation (two more processes).

``--lines grpo,dpo`` runs only those lines (of watch, sampler, grpo, dpo, long, large, extras). ``--baseline DIR``
puts a second source tree's workbench (e.g. ``git archive <commit> | tar -x -C DIR``) into the GRPO, DPO and
larger-model rotations as one more process: its lines say this tree ÷ baseline per repeat, whether the
rewards/losses were identical step by step (same seeds), and the baseline against TRL from the same repeats.

``--write`` appends the lines, the machine, the load average and the settings as an entry of today's journal
file, docs/journal/<YYYY-MM-DD>.md (benchmarks/RESULTS.md states the current figures and links there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
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
# the shared hyper-parameters of each comparison
GRPO = dict(prompts=2, num_generations=8, max_new_tokens=8, learning_rate=1e-5)
DPO = dict(batch_size=8, learning_rate=1e-5, beta=0.1)
# the larger model: a random Qwen2 from a config (no hub), 32k vocabulary; shorter runs
LARGE_MODEL = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=768, vocab_size=32000, max_position_embeddings=512)
GRPO_LARGE = dict(prompts=2, num_generations=4, max_new_tokens=16, learning_rate=1e-5)
# long responses: the shipped tiny-sums-qwen2 on the sums task (scratchpads of 8-37 tokens), the task's 48-token budget
GRPO_LONG = dict(prompts=2, num_generations=8, max_new_tokens=48, learning_rate=1e-5, task="sums")
# --model qwen2.5-0.5b (GPU): a random model of Qwen2.5-0.5B's shape (494M parameters) in bf16 on both sides; longer responses
QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                  vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
GRPO_05B = dict(prompts=4, num_generations=8, max_new_tokens=64, learning_rate=1e-6, precision="bf16")
DPO_05B = dict(batch_size=8, learning_rate=1e-6, beta=0.1, precision="bf16")
# one scoring call at a real vocabulary (Qwen2.5's), random weights built from a config
MEMORY = dict(vocab_size=151936, rows=4, tokens=256)
MARK = "@@bench "  # prefix of the worker's result lines on stdout


# --------------------------------------------------------------------------------------------
# Worker side: one process per trainer, serving repeats
# --------------------------------------------------------------------------------------------
def _clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process)."""
    return time.perf_counter(), time.process_time()


def _rates(start: tuple[float, float], end: tuple[float, float], steps: int) -> dict:
    """Steps per wall-clock second and per CPU second of the process."""
    return {"steps_per_s": steps / (end[0] - start[0]), "steps_per_cpu_s": steps / (end[1] - start[1])}


def _timed(step_fn, steps: int) -> dict:
    step_fn()  # warm-up
    start = _clock()
    for _ in range(steps):
        step_fn()
    return _rates(start, _clock(), steps)


def _train_with_clock(trainer) -> dict:
    """Run a transformers/TRL trainer; rates between the end of its first step and of its last."""
    from transformers import TrainerCallback

    times: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            times.append(_clock())

    trainer.add_callback(Clock())
    trainer.train()
    return _rates(times[0], times[-1], len(times) - 1)


def _grpo_workbench(folder, settings, steps, seed, device):
    import contextlib

    from workbench.experiments.checkpoints import load
    from workbench.tasks import rl_problems
    from workbench.trainers.grpo import GRPOConfig, GRPOTrainer

    model, tok = load(folder, **_load_options(settings))
    model.to(device)
    trainer = GRPOTrainer(model, tok, rl_problems(64, task=settings.get("task", "arith")), GRPOConfig(
        steps=10**6, prompts_per_step=settings["prompts"], num_generations=settings["num_generations"],
        max_new_tokens=settings["max_new_tokens"], learning_rate=settings["learning_rate"], progress=False, seed=seed,
        precision=settings.get("precision", "fp32"), cuda_graph=settings.get("cuda_graph", False)))
    state = {"step": 0, "tokens": 0.0, "rewards": []}

    def step():
        out = trainer.train_step(state["step"])
        state["step"] += 1
        state["tokens"] += out["response_length"] * settings["prompts"] * settings["num_generations"]
        state["rewards"].append(out["reward"])

    mode = settings.get("watch")  # None, "light" or "deep": the same steps inside workbench.watch (the watch benchmark)
    if mode:
        from workbench.watch import watch

        optimizer = getattr(trainer, "optimizer", None)
        observer = watch(model, tokenizer=tok, reference=getattr(trainer, "reference", None),
                         optimizer=getattr(optimizer, "optimizer", optimizer), deep=mode == "deep")
    with observer if mode else contextlib.nullcontext():
        result = _timed(step, steps)
    findings = len(observer.report().findings) if mode else 0
    return {**result, "tokens_per_step": state["tokens"] / state["step"], "values": state["rewards"], "findings": findings}


def _grpo_trl(folder, settings, steps, seed, device):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from workbench.core.paths import scratch_folder
    from workbench.tasks import reward, rl_problems

    tokenizer = _trl_tokenizer(folder)
    problems = {p.prompt: p for p in rl_problems(64, task=settings.get("task", "arith"))}
    eos = tokenizer.eos_token

    def reward_fn(prompts, completions, **kw):
        return [reward(c.split(eos)[0] if eos in c else c, True, problems[p]) for p, c in zip(prompts, completions, strict=True)]

    args = GRPOConfig(output_dir=scratch_folder("bench-trl-grpo-"), use_cpu=device == "cpu", report_to="none", logging_steps=10**6,
                      **_trl_precision(settings),
                      per_device_train_batch_size=settings["prompts"] * settings["num_generations"],
                      num_generations=settings["num_generations"], max_completion_length=settings["max_new_tokens"],
                      learning_rate=settings["learning_rate"], max_steps=steps + 1, beta=0.0, loss_type="grpo",
                      save_strategy="no", seed=seed, disable_tqdm=True, temperature=1.0, **_checkpointing(settings))
    trainer = GRPOTrainer(model=folder, reward_funcs=reward_fn, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in problems] * 8))
    rates = _train_with_clock(trainer)
    history = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    tokens = history[-1]["completions/mean_length"] * settings["prompts"] * settings["num_generations"] if history else 0.0
    return {**rates, "tokens_per_step": tokens,
            "values": [h["reward"] for h in trainer.state.log_history if "reward" in h]}


def _trl_tokenizer(folder):
    """The tokenizer the workbench side reads from ``folder``, for TRL's side: ``AutoTokenizer`` in transformers 5 takes
    ``Qwen2Tokenizer`` for a qwen2 config, which drops the spaces of the sums prompts ("sum 50 13 =" → other ids;
    ``modeling.models._tokenizer_from_folder``)."""
    from workbench.modeling.models import load_tokenizer

    return load_tokenizer(folder)


def _load_options(settings) -> dict:
    """``load`` options of the workbench side: sdpa as on TRL's side (``"auto"`` would take a flash back-end where one is
    installed), bf16 weights under ``precision="bf16"`` (the 0.5B-shaped model)."""
    import torch

    return {"attn_implementation": "sdpa", **({"dtype": torch.bfloat16} if settings.get("precision") == "bf16" else {})}


def _trl_precision(settings) -> dict:
    """TRL's side of ``precision``: the model loaded in bf16 and TRL's bf16 switch, or fp32 throughout."""
    if settings.get("precision") == "bf16":
        return {"bf16": True, "model_init_kwargs": {"dtype": "bfloat16"}}
    return {"bf16": False}


def _checkpointing(settings) -> dict:
    """TRL's own default (gradient checkpointing on in its GRPO and DPO configs: a second forward in
    the backward pass, which slows it), or off for the ``… (TRL without gradient checkpointing)`` lines."""
    return {"gradient_checkpointing": False} if settings.get("trl_gradient_checkpointing") is False else {}


def _dpo_workbench(folder, settings, steps, seed, device):
    from workbench.experiments.checkpoints import load
    from workbench.tasks import TRAIN_PREFERENCES, load_preferences
    from workbench.trainers.dpo import DPOConfig, DPOTrainer

    model, tok = load(folder, **_load_options(settings))
    model.to(device)
    trainer = DPOTrainer(model, tok, load_preferences(TRAIN_PREFERENCES)[:512], DPOConfig(
        steps=10**6, batch_size=settings["batch_size"], learning_rate=settings["learning_rate"], beta=settings["beta"],
        progress=False, seed=seed, precision=settings.get("precision", "fp32")))
    state = {"step": 0, "losses": []}

    def step():
        out = trainer.train_step(state["step"])
        state["step"] += 1
        state["losses"].append(out["loss"])

    return {**_timed(step, steps), "values": state["losses"]}


def _dpo_trl(folder, settings, steps, seed, device):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from workbench.core.paths import scratch_folder
    from workbench.tasks import TRAIN_PREFERENCES, load_preferences

    tokenizer = _trl_tokenizer(folder)
    pairs = [{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in load_preferences(TRAIN_PREFERENCES)[:512]]
    args = DPOConfig(output_dir=scratch_folder("bench-trl-dpo-"), use_cpu=device == "cpu", report_to="none", logging_steps=1,
                     **_trl_precision(settings),
                     per_device_train_batch_size=settings["batch_size"], learning_rate=settings["learning_rate"],
                     beta=settings["beta"], max_steps=steps + 1, save_strategy="no", seed=seed, disable_tqdm=True,
                     **_checkpointing(settings))
    trainer = DPOTrainer(model=folder, args=args, train_dataset=Dataset.from_list(pairs), processing_class=tokenizer)
    return {**_train_with_clock(trainer), "values": [h["loss"] for h in trainer.state.log_history if "loss" in h]}


RUNNERS = {"grpo-workbench": _grpo_workbench, "grpo-trl": _grpo_trl, "dpo-workbench": _dpo_workbench, "dpo-trl": _dpo_trl,
           "grpo-trl_no_gc": _grpo_trl, "dpo-trl_no_gc": _dpo_trl,
           **{f"watch-{mode}": _grpo_workbench for mode in ("none", "light", "deep")}}
NO_GC = {"trl_gradient_checkpointing": False}  # the settings of the TRL side without gradient checkpointing


def serve(kind: str, folder: str, settings: dict, steps: int, device: str, threads: int) -> None:
    """Worker loop: import everything, say ``ready``, then run one repeat per seed read from stdin."""
    import torch

    if device == "cpu":
        torch.set_num_threads(threads)
    import trl  # noqa: F401  (imported before "ready" on both sides: no import inside a timed region)

    import workbench.trainers.dpo  # noqa: F401
    import workbench.trainers.grpo  # noqa: F401
    import workbench.watch  # noqa: F401

    print(MARK + json.dumps({"ready": kind}), flush=True)
    for line in sys.stdin:
        seed = int(line)
        result = RUNNERS[kind](folder, settings, steps, seed, device)
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(MARK + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------
# Orchestrator side
# --------------------------------------------------------------------------------------------
class Worker:
    def __init__(self, kind: str, folder: str, settings: dict, steps: int, args, tree: str | None = None):
        command = [sys.executable, __file__, "--serve", kind, "--folder", folder, "--settings", json.dumps(settings),
                   "--steps", str(steps), "--device", args.device, "--threads", str(args.threads)]
        self.kind = kind
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty worker never blocks on it
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, env=_worker_env(args, tree))

    def _read(self) -> dict:
        while True:
            line = self.process.stdout.readline()
            if not line:
                self.log.seek(0)
                raise RuntimeError(f"{self.kind} worker died:\n{self.log.read()[-3000:]}")
            if line.startswith(MARK):  # trainers print to stdout too
                return json.loads(line[len(MARK):])

    def ready(self) -> None:
        self._read()

    def run(self, seed: int) -> dict:
        self.process.stdin.write(f"{seed}\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def _worker_env(args, tree: str | None = None) -> dict:
    """The worker's environment: one thread per process on a CPU; ``tree``: import ``workbench`` from that
    source tree instead (``--baseline``)."""
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    return env


def alternate(workers: dict[str, Worker], repeats: int) -> dict[str, list[dict]]:
    """``{name: [result per repeat]}``: every worker ready before the first timing, then repeats alternating
    the workers in order (the same seed adjacent in time); the workers are closed whatever happens."""
    for worker in workers.values():
        worker.ready()
    runs: dict[str, list[dict]] = {name: [] for name in workers}
    try:
        for seed in range(repeats):
            for name, worker in workers.items():
                runs[name].append(worker.run(seed))
    finally:
        for worker in workers.values():
            worker.close()
    return runs


def paired(name: str, folder: str, settings: dict, steps: int, repeats: int, args, no_gc: bool = False) -> dict:
    """Repeats alternating workbench and TRL (all processes ready before the first timing). With
    ``no_gc``, a third process runs TRL with gradient checkpointing off, in the same rotation, and
    ``summary["no_gc"]`` compares the workbench with it."""
    workers = {"workbench": Worker(f"{name}-workbench", folder, settings, steps, args),
               "trl": Worker(f"{name}-trl", folder, settings, steps, args)}
    if no_gc:
        workers["trl_no_gc"] = Worker(f"{name}-trl_no_gc", folder, {**settings, **NO_GC}, steps, args)
    if args.baseline:
        workers["baseline"] = Worker(f"{name}-workbench", folder, settings, steps, args, tree=args.baseline)
    graphed = args.cuda_graph and args.device == "cuda" and name == "grpo"
    if graphed:  # the workbench again with its decode steps replayed as CUDA graphs (RolloutConfig.cuda_graph), same rotation
        workers["workbench_graph"] = Worker(f"{name}-workbench", folder, {**settings, "cuda_graph": True}, steps, args)
    runs = alternate(workers, repeats)
    summary = _summary(runs["workbench"], runs["trl"], repeats, args)
    if no_gc:
        summary["no_gc"] = _summary(runs["workbench"], runs["trl_no_gc"], repeats, args)
    if graphed:
        summary["graph"] = {other: _summary(runs["workbench_graph"], runs[other], repeats, args)
                            for other in ("workbench", "trl", "trl_no_gc") if other in runs}
    if args.baseline:  # this tree's workbench against the baseline tree's, and the baseline against TRL
        summary["baseline"] = _summary(runs["workbench"], runs["baseline"], repeats, args)
        summary["baseline_vs_trl"] = {other: _summary(runs["baseline"], runs[other], repeats, args)
                                      for other in ("trl", "trl_no_gc") if other in runs}
        # same seeds → the same rewards/losses, step by step, when a change keeps the numbers
        summary["baseline_same_values"] = all(a["values"] == b["values"] for a, b in zip(runs["workbench"], runs["baseline"], strict=True))
    return summary


def watch_overhead(folder: str, steps: int, repeats: int, args) -> dict:
    """The workbench's GRPO step on the benchmark configuration without a watch, under the light watch and under the
    deep one: three processes, all ready before the first timing, repeats alternating none, light, deep."""
    modes = ("none", "light", "deep")
    workers = {mode: Worker(f"watch-{mode}", folder, {**GRPO, "watch": None if mode == "none" else mode}, steps, args)
               for mode in modes}
    if args.baseline:  # the baseline tree's GRPO step without and with the light watch, in the same rotation
        for mode in ("none", "light"):
            workers[f"baseline-{mode}"] = Worker(f"watch-{mode}", folder, {**GRPO, "watch": None if mode == "none" else mode},
                                                 steps, args, tree=args.baseline)
    runs = alternate(workers, repeats)
    key = "steps_per_s" if args.device == "cuda" else "steps_per_cpu_s"
    rates = {mode: [r[key] for r in runs[mode]] for mode in workers}
    baseline = {}
    if args.baseline:
        base_none, base_light = rates["baseline-none"], rates["baseline-light"]
        baseline = {"pair_ratios": [a / b for a, b in zip(base_none, base_light, strict=True)],
                    "ratio": statistics.median(base_none) / statistics.median(base_light),
                    # this tree's light watch ÷ the baseline's, time per step (> 1: this tree's watched step is faster)
                    "light_speedup": [b / a for a, b in zip(base_light, rates["light"], strict=True)],
                    "median": {mode: statistics.median(rates[f"baseline-{mode}"]) for mode in ("none", "light")}}
    return {"key": key, "rates": rates, "baseline": baseline,
            "wall": {mode: statistics.median(r["steps_per_s"] for r in runs[mode]) for mode in modes},
            "median": {mode: statistics.median(rates[mode]) for mode in modes},
            # time per step with the watch ÷ without, per repeat (the same seed, adjacent in time) and of the medians
            "pair_ratios": {mode: [a / b for a, b in zip(rates["none"], rates[mode], strict=True)] for mode in ("light", "deep")},
            "ratio": {mode: statistics.median(rates["none"]) / statistics.median(rates[mode]) for mode in ("light", "deep")},
            "findings": {mode: max(r["findings"] for r in runs[mode]) for mode in modes}}


def _watch_line(w: dict) -> str:
    unit = "steps/s" if w["key"] == "steps_per_s" else "steps per CPU-second"
    m, pairs = w["median"], {mode: ", ".join(f"{r:.3f}" for r in rs) for mode, rs in w["pair_ratios"].items()}
    light, deep = (100 * (w["ratio"][mode] - 1) for mode in ("light", "deep"))
    return (f"Watch overhead (workbench GRPO step, {GRPO['prompts']}×{GRPO['num_generations']}×{GRPO['max_new_tokens']} tokens): "
            f"without {m['none']:.2f} vs light watch {m['light']:.2f} vs deep watch {m['deep']:.2f} {unit} (wall clock "
            f"{w['wall']['none']:.2f} / {w['wall']['light']:.2f} / {w['wall']['deep']:.2f} steps/s); time per step with ÷ "
            f"without, per repeat: light {pairs['light']}; deep {pairs['deep']}; findings light {w['findings']['light']}, "
            f"deep {w['findings']['deep']} → light {w['ratio']['light']:.3f}× ({light:+.1f} %, target ≤ +5 %), "
            f"deep {w['ratio']['deep']:.3f}× ({deep:+.1f} %)")


def _watch_baseline_line(w: dict, baseline: str) -> str:
    """The baseline tree's light watch in the same rotation: its own with ÷ without, and this tree's speed-up."""
    b = w["baseline"]
    pairs, speedups = (", ".join(f"{r:.3f}" for r in rs) for rs in (b["pair_ratios"], b["light_speedup"]))
    return (f"Watch overhead, baseline {baseline}: without {b['median']['none']:.2f} vs light watch {b['median']['light']:.2f}; "
            f"time per step with ÷ without, per repeat: light {pairs} → {b['ratio']:.3f}×; this tree's light-watched step "
            f"÷ the baseline's, speed per repeat: {speedups} → {statistics.median(b['light_speedup']):.3f}×")


def _summary(workbench: list[dict], trl: list[dict], repeats: int, args) -> dict:
    """Medians, ranges and the workbench ÷ TRL ratio of one comparison."""
    runs = {"workbench": workbench, "trl": trl}
    summary = {}
    for side, results in runs.items():
        rates = [r["steps_per_s"] for r in results]
        cpu_rates = [r["steps_per_cpu_s"] for r in results]
        values = [v for r in results for v in r["values"]]
        summary[side] = {"steps_per_s": rates, "median": statistics.median(rates), "cpu_median": statistics.median(cpu_rates),
                         "steps_per_cpu_s": cpu_rates, "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
                         "range": [min(values), max(values)] if values else None}
        if "tokens_per_step" in results[0]:
            summary[side]["tokens_per_s"] = statistics.median(r["tokens_per_step"] * r["steps_per_s"] for r in results)
    # the headline: wall-clock steps/s on a GPU; on a CPU (one thread per process) steps per CPU
    # second of each process, which another process on the shared cores cannot slow down
    key = "steps_per_s" if args.device == "cuda" else "steps_per_cpu_s"
    summary["key"] = key
    summary["ratio"] = statistics.median(runs["workbench"][i][key] for i in range(repeats)) / statistics.median(
        runs["trl"][i][key] for i in range(repeats))
    summary["wall_ratio"] = summary["workbench"]["median"] / summary["trl"]["median"]
    pairs = zip(summary["workbench"][key], summary["trl"][key], strict=True)
    summary["pair_ratios"] = [a / b for a, b in pairs]
    return summary


def _baseline_lines(label: str, s: dict, value_name: str, baseline: str) -> list[str]:
    """``--baseline``: this tree's workbench ÷ the baseline tree's (same rotation), and the baseline against TRL."""
    b, unit = s["baseline"], "steps per CPU-second" if s["key"] == "steps_per_cpu_s" else "steps/s"
    median = "cpu_median" if s["key"] == "steps_per_cpu_s" else "median"
    lines = [f"{label}, this tree ÷ baseline {baseline}: {b['workbench'][median]:.2f} vs {b['trl'][median]:.2f} {unit}, "
             f"per-repeat ratios {', '.join(f'{r:.2f}' for r in b['pair_ratios'])}, {value_name} values step by step "
             f"{'identical' if s['baseline_same_values'] else 'DIFFERENT'} → {b['ratio']:.2f}×"]
    for other, name in (("trl", "TRL"), ("trl_no_gc", "TRL without gradient checkpointing")):
        if other in s["baseline_vs_trl"]:
            o = s["baseline_vs_trl"][other]
            lines.append(f"{label}, baseline vs {name}: per-repeat ratios {', '.join(f'{r:.2f}' for r in o['pair_ratios'])} "
                         f"→ {o['ratio']:.2f}×")
    return lines


def _comparison_line(label: str, s: dict, value_name: str) -> str:
    ours, theirs = s["workbench"], s["trl"]
    tokens = (f", generated tok/s {ours['tokens_per_s']:.0f} vs {theirs['tokens_per_s']:.0f}" if "tokens_per_s" in ours else "")

    def fmt(r):
        return "—" if r is None else f"[{r[0]:.3g}, {r[1]:.3g}]"

    pairs = ", ".join(f"{r:.2f}" for r in s["pair_ratios"])
    if s["key"] == "steps_per_cpu_s":
        speed = (f"workbench {ours['cpu_median']:.2f} vs TRL {theirs['cpu_median']:.2f} steps per CPU-second "
                 f"(wall clock {ours['median']:.2f} vs {theirs['median']:.2f} steps/s, {s['wall_ratio']:.2f}×)")
    else:
        speed = f"workbench {ours['median']:.2f} steps/s vs TRL {theirs['median']:.2f} steps/s"
    return (f"{label}: {speed}{tokens}, peak RSS {ours['peak_rss_mb']:.0f} vs {theirs['peak_rss_mb']:.0f} MB, "
            f"{value_name} range {fmt(ours['range'])} vs {fmt(theirs['range'])}, per-repeat ratios {pairs} → {s['ratio']:.2f}×")


def _save_model(folder: str, model, tokenizer) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ---- memory ----------------------------------------------------------------------------------
def _naive_scoring(model, input_ids, attention_mask):
    """The naive scorer: full logits, upcast whole, a full log-softmax for the entropy."""
    import torch
    import torch.nn.functional as F

    from workbench.modeling.scoring import forward

    logits = forward(model, input_ids, attention_mask)[:, :-1].float()
    logprobs = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        log_probs = F.log_softmax(logits.detach(), dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logprobs, entropy


def _peak_mb(fn, device: str) -> float:
    """Peak memory (MB) above what was held before ``fn()`` ran: the CUDA allocator's peak on a GPU,
    the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) on a CPU."""
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

    from workbench.modeling.scoring import token_logprobs
    from workbench.modeling.tiny import tiny_model

    model, _ = tiny_model("qwen2", vocab_size=MEMORY["vocab_size"], seed=0)
    model.to(device)
    rows, tokens = MEMORY["rows"], MEMORY["tokens"]
    ids = torch.randint(4, MEMORY["vocab_size"], (rows, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones_like(ids)
    paths = {"naive": _naive_scoring, "chunked": lambda m, i, k: token_logprobs(m, i, k, with_entropy=True)}
    out = {"rows": rows, "tokens": tokens, "vocab_size": MEMORY["vocab_size"],
           "parameters": sum(p.numel() for p in model.parameters())}
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


def run_memory(args) -> dict:
    done = subprocess.run([sys.executable, __file__, "--memory-worker", "--device", args.device, "--threads", str(args.threads)],
                          capture_output=True, text=True, env=_worker_env(args))
    if done.returncode != 0:
        raise RuntimeError(f"memory worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- the sampler vs model.generate ------------------------------------------------------------
LINES = ("watch", "sampler", "grpo", "dpo", "long", "large", "workers", "extras")  # what --lines selects (extras: packing, memory, EOS)
SAMPLER = {"tiny": dict(prompts=2, num_generations=8, max_new_tokens=8, calls=40),
           "large": dict(prompts=2, num_generations=4, max_new_tokens=16, calls=3),
           "qwen2.5-0.5b": dict(prompts=4, num_generations=8, max_new_tokens=64, calls=3)}


def sampler_worker(size: str, rounds: int, device: str) -> dict:
    """Tokens per CPU-second (wall clock on a GPU) of each side, rounds alternating the sides."""
    import torch

    from workbench.experiments.checkpoints import load
    from workbench.modeling.rollout import sample
    from workbench.modeling.tiny import tiny_model
    from workbench.tasks import encode_prompts, rl_problems

    settings = SAMPLER[size]
    if size == "tiny":
        model, tok = load("tiny-arith-qwen2")
    elif size == "large":
        model, tok = tiny_model("qwen2", seed=0, **LARGE_MODEL)
    else:
        model, tok = tiny_model("qwen2", seed=0, dtype=torch.bfloat16, attn_implementation="sdpa", **QWEN25_05B)
    model.to(device).eval()
    ids, mask = (t.to(device) for t in encode_prompts(tok, [p.prompt for p in rl_problems(settings["prompts"])
                                                             for _ in range(settings["num_generations"])]))
    common = dict(max_new_tokens=settings["max_new_tokens"], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)

    def workbench(seed, draw="multinomial", cuda_graph=False):
        rollout = sample(model, ids, mask, generator=torch.Generator(device).manual_seed(seed), share_prefill=True,
                         static_cache=True, draw=draw, cuda_graph=cuda_graph, **common)
        return rollout.tokens_generated

    def generate(seed):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=settings["max_new_tokens"], eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        return (out.shape[1] - ids.shape[1]) * ids.shape[0]

    sides = {"workbench": workbench, "generate": generate}
    if size == "large":
        sides["inverse_cdf"] = lambda seed: workbench(seed, "inverse_cdf")
    if device == "cuda":  # the decode step replayed as a CUDA graph (recorded once per call, inside the timing)
        sides["cuda_graph"] = lambda seed: workbench(seed, cuda_graph=True)
    rates: dict[str, list[float]] = {side: [] for side in sides}
    for fn in sides.values():
        fn(0)  # warm-up
    for round_number in range(rounds):
        for side, fn in sides.items():
            start, tokens = _timer(device), 0
            for call in range(settings["calls"]):
                tokens += fn(1000 * round_number + call)
            if device == "cuda":
                torch.cuda.synchronize()
            rates[side].append(tokens / (_timer(device) - start))
    result = {"settings": settings, "rates": rates, "device": device}
    if device == "cuda":
        result["cuda_graph_agreement"] = _graph_agreement(model, ids, mask, common)
    return result


def _graph_agreement(model, ids, mask, common) -> dict:
    """The CUDA-graph path against the static decoder on the benchmark's prompts, same seeds (three): rows whose sampled
    tokens are identical, and the largest |Δ log p| over the tokens both sampled while they still agreed
    (``rollout_agreement``)."""
    import torch

    from workbench.modeling.rollout import rollout_agreement, sample

    rows = same = 0
    worst = 0.0
    for seed in range(3):
        a, b = (sample(model, ids, mask, generator=torch.Generator(ids.device).manual_seed(seed), share_prefill=True, static_cache=True,
                       cuda_graph=graph, **common) for graph in (False, True))
        agreement = rollout_agreement(a, b)
        rows, same = rows + agreement["rows"], same + agreement["identical_rows"]
        worst = max(worst, agreement["max_abs_logprob_gap"])
    return {"rows": rows, "identical_rows": same, "max_abs_logprob_difference": worst}


def run_sampler(size: str, rounds: int, args) -> dict:
    done = subprocess.run([sys.executable, __file__, "--sampler-worker", size, "--repeats", str(rounds), "--device", args.device,
                           "--threads", str(args.threads)], capture_output=True, text=True, env=_worker_env(args))
    if done.returncode != 0:
        raise RuntimeError(f"sampler worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


SAMPLER_SIDES = {"generate": "model.generate", "workbench": "the static decoder"}  # what a sampler line compares against


def _sampler_line(label: str, result: dict, side: str = "workbench", against: str = "generate") -> str:
    """``side``'s tokens per (CPU-)second against ``against``'s: medians, per-round ratios, the ratio of the medians."""
    rates, s = result["rates"], result["settings"]
    pairs = [a / b for a, b in zip(rates[side], rates[against], strict=True)]
    ratio = statistics.median(rates[side]) / statistics.median(rates[against])
    return (f"{label} ({s['prompts']}×{s['num_generations']} rows, ≤ {s['max_new_tokens']} tokens, {s['calls']} calls per round): "
            f"{statistics.median(rates[side]):.0f} vs {SAMPLER_SIDES[against]} {statistics.median(rates[against]):.0f} tokens per "
            f"{'second' if result.get('device') == 'cuda' else 'CPU-second'}, "
            f"per-round ratios {', '.join(f'{p:.2f}' for p in pairs)} → {ratio:.2f}×")


def _graph_lines(label: str, result: dict) -> list[str]:
    """On a GPU: the CUDA-graph side against model.generate and against the static decoder, and their agreement."""
    if "cuda_graph" not in result["rates"]:
        return []
    agreement = result["cuda_graph_agreement"]
    return [_sampler_line(f"{label}, cuda_graph=True", result, side="cuda_graph"),
            _sampler_line(f"{label}, cuda_graph=True", result, side="cuda_graph", against="workbench")
            + f"; same seeds: {agreement['identical_rows']}/{agreement['rows']} rows identical, max |Δ log p| "
              f"{agreement['max_abs_logprob_difference']:.2e} while the tokens agree"]


# ---- training workers: spawned, or forked from a clean copy of the kernel ---------------------------------------
WORKERS = dict(variants=2, steps=1, problems=4, prompts_per_step=2, max_new_tokens=4)


def workers_worker(mode: str) -> dict:
    """One ``train_variants`` call with 2 worker processes in a process that has the catalogue kernel's imports:
    CPU-seconds of this process and all its descendants during the call, and the records (wall times dropped)."""
    import torch

    from workbench.catalogue import kernel_fork
    from workbench.core import worker_processes
    from workbench.experiments import comparison

    kernel_fork.preload()  # the imports a catalogue kernel starts with (forked from the zygote)
    if mode == "forked" and worker_processes.start_fork_server() is None:  # what catalogue.kernel_fork does in each kernel
        raise RuntimeError(f"no fork server here: {worker_processes.unsupported()}")
    variants = {f"v{i}": {} for i in range(WORKERS["variants"])}

    def cpu() -> float:
        return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                   for field in ("ru_utime", "ru_stime"))

    start_method = worker_processes.context().get_start_method()
    start, wall = cpu(), time.perf_counter()
    runs = comparison.train_variants("ppo", "tiny-arith-qwen2", variants, steps=WORKERS["steps"], problems=WORKERS["problems"],
                                     prompts_per_step=WORKERS["prompts_per_step"], max_new_tokens=WORKERS["max_new_tokens"],
                                     processes=2)
    wall = time.perf_counter() - wall
    worker_processes.stop_fork_server()  # reaped: its workers' CPU time is counted in RUSAGE_CHILDREN from here on
    records = {label: [[{k: v for k, v in r.items() if k != "seconds" and not k.endswith("_seconds")} for r in history]
                       for history in histories] for label, histories in runs.items()}
    return {"cpu_s": cpu() - start, "wall_s": wall, "records": records, "threads": torch.get_num_threads(),
            "start_method": start_method}


def run_workers(repeats: int, args) -> dict:
    """``repeats`` rounds alternating spawned and forked, each call in a fresh process."""
    rounds: dict[str, list[dict]] = {"spawned": [], "forked": []}
    for _ in range(repeats):
        for mode in rounds:
            done = subprocess.run([sys.executable, __file__, "--workers-worker", mode], capture_output=True, text=True,
                                  env=_worker_env(args))
            if done.returncode != 0:
                raise RuntimeError(f"workers worker ({mode}) failed:\n{done.stderr[-3000:]}")
            rounds[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            expected = "forkserver" if mode == "forked" else "spawn"
            if rounds[mode][-1]["start_method"] != expected:
                raise RuntimeError(f"the {mode} round started its workers by {rounds[mode][-1]['start_method']}, not {expected}")
    return rounds


def _workers_line(rounds: dict) -> str:
    spawned, forked = ([r["cpu_s"] for r in rounds[m]] for m in ("spawned", "forked"))
    same = all(a["records"] == b["records"] for a, b in zip(rounds["spawned"], rounds["forked"], strict=True))
    w = WORKERS
    return (f"Training workers (one train_variants call, 2 worker processes, {w['variants']} PPO runs of {w['steps']} step on "
            f"tiny-arith-qwen2): spawned {statistics.median(spawned):.1f} vs forked from the kernel's clean copy "
            f"{statistics.median(forked):.1f} CPU-seconds (the call and every process under it), per-round ratios "
            f"{', '.join(f'{a / b:.2f}' for a, b in zip(spawned, forked, strict=True))}; wall "
            f"{statistics.median(r['wall_s'] for r in rounds['spawned']):.1f} vs "
            f"{statistics.median(r['wall_s'] for r in rounds['forked']):.1f} s; "
            f"records {'identical' if same else 'DIFFERENT'} → {statistics.median(spawned) / statistics.median(forked):.2f}×")


# ---- packing and EOS -------------------------------------------------------------------------
def _timer(device: str) -> float:
    """Wall clock on a GPU; this process's CPU time on a CPU (immune to other processes' load)."""
    return time.perf_counter() if device == "cuda" else time.process_time()


def scoring_throughput(model, sequences, *, packed: bool, device: str, repeats: int) -> float:
    """Real tokens scored per second (median of ``repeats``; CPU seconds on a CPU), right-padded or bin-packed."""
    import torch

    from workbench.core.batching import pad_sequences
    from workbench.modeling.scoring import token_logprobs

    ids, mask = (t.to(device) for t in pad_sequences(sequences, 0, side="right"))
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            start = _timer(device)
            token_logprobs(model, ids, mask, packed=packed)
            if device == "cuda":
                torch.cuda.synchronize()
            if i:  # the first call is a warm-up
                times.append(_timer(device) - start)
    return int(mask.sum()) / statistics.median(times)


def one_row_throughput(model, sequences, *, device: str, repeats: int) -> float:
    """The same, all sequences in one packed row (a total × total mask, against the bin-packed rows)."""
    import torch

    from workbench.core.batching import pack_sequences
    from workbench.modeling.scoring import logprobs_from_logits

    batch = pack_sequences(sequences)
    inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.model_inputs().items()}
    targets = batch.targets.to(device)
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            start = _timer(device)
            logprobs_from_logits(model(**inputs).logits, targets)
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times.append(_timer(device) - start)
    return sum(batch.lengths) / statistics.median(times)


def extras(args) -> dict:
    import torch

    from workbench.core.batching import first_fit_decreasing
    from workbench.experiments.checkpoints import load
    from workbench.modeling.tiny import tiny_model
    from workbench.pitfalls.nb03_eos_termination import generation_cost, rollout_pair
    from workbench.tasks import TEST_PROMPTS, load_problems

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    model, tokenizer = load("tiny-arith-qwen2")
    prompts = [p.prompt for p in load_problems(TEST_PROMPTS)[:64]]
    rollout_pair(model, tokenizer, prompts, max_new_tokens=32)  # warm-up: on a GPU the first rollout pays CUDA's start-up
    pair = rollout_pair(model, tokenizer, prompts, max_new_tokens=32)
    bug, fix = generation_cost(pair["bug"]), generation_cost(pair["fix"])
    rng = random.Random(0)
    lengths = [rng.choice([8, 16, 32, 64, 128, 200]) for _ in range(32)]
    ragged = [[1] + [rng.randrange(4, 64) for _ in range(n - 1)] for n in lengths]
    tiny, _ = tiny_model("qwen2")
    tiny.to(args.device)
    repeats = 5 if args.quick else 11
    padded, packed, one_row = [], [], []
    for _ in range(3):  # alternate the layouts, median of medians
        padded.append(scoring_throughput(tiny, ragged, packed=False, device=args.device, repeats=repeats))
        packed.append(scoring_throughput(tiny, ragged, packed=True, device=args.device, repeats=repeats))
        one_row.append(one_row_throughput(tiny, ragged, device=args.device, repeats=repeats))
    padded_tok_s, packed_tok_s = statistics.median(padded), statistics.median(packed)
    return {"eos_time_ratio": bug["seconds"] / fix["seconds"], "eos_tokens_bug": bug["tokens_generated"],
            "eos_tokens_fix": fix["tokens_generated"], "packed_speedup": packed_tok_s / padded_tok_s,
            "padded_tok_s": padded_tok_s, "packed_tok_s": packed_tok_s, "one_row_tok_s": statistics.median(one_row),
            "rows": len(first_fit_decreasing(lengths, max(lengths))), "sequences": len(lengths)}


def qwen05b_lines(args, chosen: set[str], base: str, steps: int, repeats: int) -> list[str]:
    """The sampler, GRPO and DPO lines on a random model of Qwen2.5-0.5B's shape in bf16 (``--model qwen2.5-0.5b``)."""
    import torch

    from workbench.modeling.tiny import tiny_model

    model, tokenizer = tiny_model("qwen2", seed=0, dtype=torch.bfloat16, attn_implementation="sdpa", **QWEN25_05B)
    size = f"random Qwen2.5-0.5B shape, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, bf16"
    folder = _save_model(f"{base}/qwen2.5-0.5b", model, tokenizer)
    del model
    lines = []
    if "sampler" in chosen:
        result = run_sampler("qwen2.5-0.5b", max(3, repeats), args)
        lines.append(_sampler_line(f"Sampler, {size}, {args.device}", result))
        lines.extend(_graph_lines(f"Sampler, {size}, {args.device}", result))
    for kind, settings, measure in (("grpo", GRPO_05B, "reward"), ("dpo", DPO_05B, "loss")):
        if kind in chosen:
            summary = paired(kind, folder, settings, steps, repeats, args, no_gc=True)
            lines.append(_comparison_line(f"{kind.upper()}, {size}", summary, measure))
            lines.append(_comparison_line(f"{kind.upper()}, {size} (TRL without gradient checkpointing)", summary["no_gc"], measure))
            lines += _graph_comparison_lines(f"{kind.upper()}, {size}", summary, measure)
    return lines


def _graph_comparison_lines(label: str, summary: dict, measure: str) -> list[str]:
    """``--cuda-graph`` on a GPU: the workbench with CUDA-graph decoding against TRL (both settings) and against itself without."""
    names = {"trl": "TRL", "trl_no_gc": "TRL without gradient checkpointing", "workbench": "the workbench without cuda_graph"}
    return [_comparison_line(f"{label}, cuda_graph=True (the 'TRL' side: {names[other]})", s, measure)
            for other, s in summary.get("graph", {}).items()]


def journal_file() -> Path:
    """Today's journal file, docs/journal/<YYYY-MM-DD>.md, started with its title when it does not exist yet."""
    path = HERE.parent / "docs" / "journal" / f"{time.strftime('%Y-%m-%d')}.md"
    if not path.exists():
        path.write_text(f"# {time.strftime('%Y-%m-%d')}\n")
    return path


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda-graph", action="store_true",
                        help="with --device cuda: the GRPO lines also time the workbench with RolloutConfig.cuda_graph=True "
                             "(decode steps replayed as CUDA graphs) in the same rotation")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats (about 3 minutes on 2 quiet CPU cores)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per repeat (tiny model)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per side (≥ 3 for a median worth quoting)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads per process on a CPU (both sides)")
    parser.add_argument("--model", default="tiny", choices=("tiny", "qwen2.5-0.5b"),
                        help="tiny: the shipped tiny-arith-qwen2 (and the 12M larger model); qwen2.5-0.5b: a random model of "
                             "Qwen2.5-0.5B's shape in bf16 for the sampler, GRPO and DPO lines (a GPU run: --device cuda)")
    parser.add_argument("--write", action="store_true", help="append the results to today's journal file, docs/journal/<YYYY-MM-DD>.md")
    parser.add_argument("--watch-only", action="store_true", help="only the watch-overhead line (GRPO with vs without workbench.watch)")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sampler-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workers-worker", default=None, choices=("spawned", "forked"), help=argparse.SUPPRESS)
    parser.add_argument("--only-sampler", action="store_true", help="run the sampler lines only")
    parser.add_argument("--lines", default=",".join(LINES),
                        help=f"comma-separated lines to run, of {', '.join(LINES)} (default: all)")
    parser.add_argument("--baseline", default=None, metavar="DIR",
                        help="a second source tree (e.g. `git archive <commit> | tar -x -C DIR`): its workbench joins the "
                             "GRPO/DPO/larger-model rotations as a fourth process (the watch line's as two more: without "
                             "and with the light watch); prints this tree ÷ baseline per repeat")
    args = parser.parse_args()
    chosen = {"sampler"} if args.only_sampler else {"watch"} if args.watch_only else set(args.lines.split(","))
    if not chosen <= set(LINES):
        parser.error(f"--lines {args.lines!r}: unknown {sorted(chosen - set(LINES))}; choose among {', '.join(LINES)}")
    steps = args.steps or (20 if args.quick else 40)
    repeats = args.repeats or (3 if args.quick else 5)
    if args.serve:
        serve(args.serve, args.folder, json.loads(args.settings), steps, args.device, args.threads)
        return 0
    if args.memory_worker:
        print(json.dumps(memory_worker(args.device)))
        return 0
    if args.sampler_worker:
        if args.device == "cpu":
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(sampler_worker(args.sampler_worker, repeats, args.device)))
        return 0
    if args.workers_worker:
        print(json.dumps(workers_worker(args.workers_worker)))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--device cuda: no CUDA device here; run it on a GPU machine", file=sys.stderr)
            return 2

    from workbench.core.paths import scratch_folder
    from workbench.experiments.checkpoints import load
    from workbench.modeling.tiny import tiny_model

    start, load_before = time.perf_counter(), _load()
    lines, results = [], {}
    base = scratch_folder("bench-models-")  # the saved model copies the workers load: removed at exit
    if args.model == "qwen2.5-0.5b":
        lines = qwen05b_lines(args, chosen, base, steps, repeats)
        return _finish(args, lines, start, load_before, steps, repeats, steps)
    tiny_folder = _save_model(f"{base}/tiny", *load("tiny-arith-qwen2"))
    if "watch" in chosen:
        results["watch"] = watch_overhead(tiny_folder, steps, repeats, args)
        lines.append(_watch_line(results["watch"]))
        if args.baseline:
            lines.append(_watch_baseline_line(results["watch"], args.baseline))
    large_steps = 3 if args.quick else 8
    if chosen & {"sampler", "large"}:
        large, large_tok = tiny_model("qwen2", seed=0, **LARGE_MODEL)
        large_params = sum(p.numel() for p in large.parameters())
        large_folder = _save_model(f"{base}/large", large, large_tok)
        del large
    if "sampler" in chosen:
        results["sampler"] = {size: run_sampler(size, max(3, repeats), args) for size in ("tiny", "large")}
        lines.append(_sampler_line("Sampler, tiny model", results["sampler"]["tiny"]))
        lines.extend(_graph_lines(f"Sampler, tiny model, {args.device}", results["sampler"]["tiny"]))
        large_label = f"Sampler, larger model ({large_params / 1e6:.1f}M parameters, {LARGE_MODEL['vocab_size']} vocabulary)"
        lines.append(_sampler_line(large_label, results["sampler"]["large"]))
        lines.extend(_graph_lines(f"{large_label}, {args.device}", results["sampler"]["large"]))
        lines.append(_sampler_line("Sampler, larger model, draw='inverse_cdf' (other tokens per seed)", results["sampler"]["large"],
                                   side="inverse_cdf"))
    if args.only_sampler or args.watch_only:
        print("\n".join(lines))
        return 0
    # the trainers against TRL, the larger model, packing, memory and EOS stopping
    long_name = (f"GRPO, long responses (tiny-sums-qwen2, sums task, "
                 f"{GRPO_LONG['prompts']}×{GRPO_LONG['num_generations']}×≤{GRPO_LONG['max_new_tokens']} tokens)")
    against_trl = (  # each against TRL, with and without gradient checkpointing:
        # --lines key, printed name, trainer, checkpoint, settings, timed steps, name in the baseline lines
        ("grpo", "GRPO", "grpo", "tiny-arith-qwen2", GRPO, steps, "GRPO"),
        ("dpo", "DPO", "dpo", "tiny-arith-qwen2", DPO, steps, "DPO"),
        ("long", long_name, "grpo", "tiny-sums-qwen2", GRPO_LONG, 2 * large_steps, "GRPO, long responses"),
    )
    for line, name, kind, checkpoint, settings, line_steps, short in against_trl:
        if line not in chosen:
            continue
        folder = tiny_folder if checkpoint == "tiny-arith-qwen2" else _save_model(f"{base}/{checkpoint}", *load(checkpoint))
        measure = "loss" if kind == "dpo" else "reward"
        results[line] = paired(kind, folder, settings, line_steps, repeats, args, no_gc=True)
        lines.append(_comparison_line(name, results[line], measure))
        lines.append(_comparison_line(f"{name} (TRL without gradient checkpointing)", results[line]["no_gc"], measure))
        lines += _graph_comparison_lines(name, results[line], measure)
        if args.baseline:
            lines += _baseline_lines(short, results[line], measure, args.baseline)
    if "large" in chosen:
        label = (f"GRPO, larger model (random Qwen2, {large_params / 1e6:.1f}M parameters, {LARGE_MODEL['vocab_size']} vocabulary, "
                 f"{GRPO_LARGE['prompts']}×{GRPO_LARGE['num_generations']}×{GRPO_LARGE['max_new_tokens']} tokens)")
        results["grpo_large"] = paired("grpo", large_folder, GRPO_LARGE, large_steps, max(3, repeats - 2), args)
        lines.append(_comparison_line(label, results["grpo_large"], "reward"))
        if args.baseline:
            lines += _baseline_lines("GRPO, larger model", results["grpo_large"], "reward", args.baseline)
    if "workers" in chosen and args.device == "cpu":
        results["workers"] = run_workers(max(3, repeats), args)
        lines.append(_workers_line(results["workers"]))
    if "extras" not in chosen:
        return _finish(args, lines, start, load_before, steps, repeats, large_steps)
    extra = extras(args)
    lines.append(f"Packed vs padded scoring ({extra['sequences']} ragged sequences, 8–200 tokens, first-fit-decreasing into "
                 f"{extra['rows']} rows of 200; one row of everything: {extra['one_row_tok_s']:.0f} tok/s): "
                 f"{extra['padded_tok_s']:.0f} → {extra['packed_tok_s']:.0f} tok/s → {extra['packed_speedup']:.2f}×")
    memory = run_memory(args)
    m = memory
    lines.append(f"Scoring memory (one call, log-probs + entropy, {m['rows']}×{m['tokens']} tokens, "
                 f"vocabulary {m['vocab_size']}, {m['parameters'] / 1e6:.1f}M parameters): "
                 f"naive {m['naive_scoring_mb']:.0f} MB → chunked {m['chunked_scoring_mb']:.0f} MB "
                 f"(training call with backward: {m['naive_training_mb']:.0f} → "
                 f"{m['chunked_training_mb']:.0f} MB, {m['naive_training_mb'] / m['chunked_training_mb']:.2f}× less) → "
                 f"{m['naive_scoring_mb'] / m['chunked_scoring_mb']:.2f}×")
    lines.append(f"EOS stopping: {extra['eos_tokens_bug']} → {extra['eos_tokens_fix']} tokens for 64 responses, rollout time "
                 f"→ {extra['eos_time_ratio']:.2f}×")
    return _finish(args, lines, start, load_before, steps, repeats, large_steps)


def _finish(args, lines: list[str], start: float, load_before: str, steps: int, repeats: int, large_steps: int) -> int:
    """Print the lines (and append them to today's journal file with ``--write``)."""
    load_after = _load()
    for line in lines:
        print(line)
    elapsed = time.perf_counter() - start
    step_counts = f"{steps} timed steps ({2 * large_steps} for long responses, {large_steps} for the larger model)"
    print(f"({elapsed:.0f} s, {step_counts} × {repeats} repeats per side, {args.device}, {args.threads} thread(s); "
          f"load average (1/5/15 min) {load_before} before, {load_after} after)")
    if args.write:
        import torch
        import transformers
        import trl

        from workbench.catalogue.report import cpu_model

        machine = f"{cpu_model()}, {os.cpu_count()} CPU cores"
        if args.device == "cuda":
            machine += f", {torch.cuda.get_device_name()}"
        with open(journal_file(), "a") as f:
            only = "" if set(args.lines.split(",")) == set(LINES) else f" (lines: {args.lines})"
            versus = f", against baseline tree {args.baseline}" if args.baseline else ""
            f.write(f"\n## {time.strftime('%H:%M')} — benchmarks: {'quick' if args.quick else 'full'} run{only}{versus}, {args.device}\n\n")
            f.write(f"Machine: {machine}, Python {platform.python_version()}, torch {torch.__version__}, "
                    f"transformers {transformers.__version__}, trl {trl.__version__}; {args.threads} thread(s) per process; "
                    f"load average (1/5/15 min) {load_before} before, {load_after} after ({elapsed:.0f} s)\n\n")
            for line in lines:
                f.write(f"- {line}\n")
            f.write(f"\nSettings: GRPO {GRPO}, DPO {DPO}, long-response GRPO {GRPO_LONG}, larger-model GRPO {GRPO_LARGE} on "
                    f"{LARGE_MODEL}; {step_counts} × {repeats} repeats per side, alternating, median reported.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
