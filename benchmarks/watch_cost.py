"""The light watch's cost on the workbench's GRPO step, measured inside one process (paired, interleaved).

    python benchmarks/watch_cost.py                 # 8 rounds × 4 modes × 20 timed steps, about 1 minute
    python benchmarks/watch_cost.py --rounds 12 --steps 30 --own

``benchmarks/run.py --watch-only`` compares three processes; on a shared machine the processes' speeds drift
apart by ±10 %, which is twice the 5 % target. Here one trainer on one model (the benchmark configuration:
``tiny-arith-qwen2``, GRPO 2 prompts × 8 generations × 8 new tokens, one thread) runs blocks of steps in four
modes, rotated block by block (the rotation shifted every round, so no mode always follows another):

* ``none`` — no watch;
* ``light`` — ``workbench.watch(model, tokenizer, optimizer=...)``: the fast paths (static-cache decoder,
  inline training body) run and report their calls to it;
* ``light-hooked`` — the same watch with its hooks *not* covered (``core.observers.covered`` answers False):
  the fast paths see foreign hooks and fall back to ``model(...)``/``model.model(...)``: what covering the hooks
  saves, measured in the same process;
* ``deep`` — ``deep=True``.

CPU time of this process per step (``time.process_time``: other processes on the shared cores do not count).
Printed: the median ms per step of each mode, and each watched mode's time ÷ the same round's ``none`` (one
number per round, then their median). ``--own`` also times the watch's own code (its hooks, event handlers
and optimiser hooks, outermost calls only) in the light mode: what is left of the cost that is the watch's work.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

MODES = ("none", "light", "light-hooked", "deep")
GRPO = dict(prompts_per_step=2, num_generations=8, max_new_tokens=8, learning_rate=1e-5)
WATCH_ENTRY_POINTS = ("_pre", "_post", "_on_event", "_generate", "_optimizer_pre", "_optimizer_post", "_hidden_grad")


def _own_time_counter(watch_class) -> dict:
    """Wrap the watch's entry points so that the CPU time spent in them (outermost calls only) is summed."""
    state = {"seconds": 0.0, "depth": 0, "calls": 0}

    def timed(original):
        def wrapper(*args, **kwargs):
            if state["depth"]:
                return original(*args, **kwargs)
            state["depth"], state["calls"], start = 1, state["calls"] + 1, time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                state["seconds"] += time.process_time() - start
                state["depth"] = 0
        return wrapper

    for name in WATCH_ENTRY_POINTS:
        setattr(watch_class, name, timed(getattr(watch_class, name)))
    return state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8, help="rounds; each runs one block per mode")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block (after one untimed step)")
    parser.add_argument("--own", action="store_true", help="also time the watch's own code in the light mode")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from workbench.core import observers
    from workbench.experiments.checkpoints import load
    from workbench.tasks import rl_problems
    from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
    from workbench.watch import Watch, watch

    own = _own_time_counter(Watch) if args.own else None
    model, tokenizer = load("tiny-arith-qwen2")
    trainer = GRPOTrainer(model, tokenizer, rl_problems(64), GRPOConfig(steps=10**6, progress=False, seed=0, **GRPO))
    step_index = [0]

    def block(mode: str) -> float:
        """CPU ms per step of ``args.steps`` steps in ``mode`` (one untimed step first)."""
        covered = observers.covered
        if mode == "light-hooked":
            observers.covered = lambda hook: False
        w = None if mode == "none" else watch(model, tokenizer=tokenizer, optimizer=trainer.optimizer, deep=mode == "deep")
        try:
            if w is not None:
                w.__enter__()
            trainer.train_step(step_index[0])
            step_index[0] += 1
            own_before = own["seconds"] if own else 0.0
            start = time.process_time()
            for _ in range(args.steps):
                trainer.train_step(step_index[0])
                step_index[0] += 1
            elapsed = time.process_time() - start
            if own and mode == "light":
                own.setdefault("light", []).append(1000 * (own["seconds"] - own_before) / args.steps)
        finally:
            if w is not None:
                w.close()
            observers.covered = covered
        return 1000 * elapsed / args.steps

    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_number in range(args.rounds):
        order = MODES[round_number % len(MODES):] + MODES[: round_number % len(MODES)]
        for mode in order:
            times[mode].append(block(mode))
    print(f"{args.rounds} rounds × {len(MODES)} modes × {args.steps} timed steps, CPU ms per step (median): "
          + ", ".join(f"{mode} {statistics.median(times[mode]):.2f}" for mode in MODES))
    for mode in MODES[1:]:
        ratios = [a / b for a, b in zip(times[mode], times["none"], strict=True)]
        print(f"  {mode} ÷ none per round: {', '.join(f'{x:.3f}' for x in ratios)} → median {statistics.median(ratios):.3f}×")
    hooked = [a / b for a, b in zip(times["light-hooked"], times["light"], strict=True)]
    print(f"  light-hooked ÷ light per round: {', '.join(f'{x:.3f}' for x in hooked)} → median {statistics.median(hooked):.3f}×")
    if own:
        light = statistics.median(times["light"])
        print(f"  the watch's own code in the light mode: {statistics.median(own['light']):.3f} ms per step "
              f"({100 * statistics.median(own['light']) / light:.1f} % of a light-watched step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
