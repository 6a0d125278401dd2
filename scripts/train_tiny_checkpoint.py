"""Train a shipped tiny checkpoint by supervised fine-tuning on a task (``workbench.tasks.registry``).

    python scripts/train_tiny_checkpoint.py --arch qwen2                 # arith, 1050 steps, ~40 s
    python scripts/train_tiny_checkpoint.py --arch gpt2                  # arith, 3000 steps, ~2-5 min
    python scripts/train_tiny_checkpoint.py --task sums                  # sums (qwen2), see DEFAULTS, ~10 min
    python scripts/train_tiny_checkpoint.py --task restate               # restate (qwen2), see DEFAULTS, ~1 min
    python scripts/train_tiny_checkpoint.py --task arith --head-dim 32   # tiny-arith-qwen2-hd32: vLLM's CPU attention

Writes ``data/checkpoints/tiny-<task>-<arch>/`` (safetensors + tokenizer), its ``training.json`` and a
card ``README.md`` (parameters, command, time, held-out greedy accuracy, lengths of the correct and of the
generated responses, greedy and sampled at temperature 1), and prints the card. Training is short on purpose: RL needs
a policy that is right sometimes, not always. ``--max-seconds`` stops SFT early at a wall-clock budget (the smoke test uses it).
"""

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from workbench.core.paths import DATA_DIR
from workbench.experiments.evaluation import greedy_results, response_results
from workbench.modeling.models import count_parameters, save
from workbench.modeling.tiny import TRAINED_CHECKPOINTS, tiny_model
from workbench.tasks import load_problems, task_info
from workbench.trainers.sft import SFTConfig, SFTTrainer

SIZES = {  # per task (the same tiny Qwen2 family: 422k parameters with the 64-token character tokenizer)
    "arith": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4),
    "sums": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4),
    "restate": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4),
}
# SFT steps and learning rate per (task, architecture): chosen so the greedy test accuracy lands between ~30% and
# ~60% (GPT-2's learned positions make it slower to learn arithmetic than the rotary Qwen2). Sums, qwen2, lr 3e-3,
# batch 64, accuracy on 500 held-out prompts: 1500 steps gave 0.24 (200 prompts), 3500 steps 0.666; 2500 in between.
DEFAULTS = {
    ("arith", "qwen2"): dict(steps=1050, lr=3e-3), ("arith", "gpt2"): dict(steps=3000, lr=3e-3),
    ("arith", "llama"): dict(steps=1050, lr=3e-3),
    ("sums", "qwen2"): dict(steps=2500, lr=3e-3),
    # restate, qwen2, lr 3e-3, batch 64, greedy accuracy on the 2010 test prompts: 1050 steps 0.984, 600 0.825, 400 0.446.
    ("restate", "qwen2"): dict(steps=400, lr=3e-3),
}
# head_dim 32 (3 heads of 32 over the same hidden size 96, one key/value head): the head dims vLLM's CPU attention
# accepts start at 32 (``workbench.engines.checks.SUPPORTED_HEAD_DIMS``), the shipped 4 × 24 fails there. Trained with the
# same learning rate as the task's qwen2 (steps: HEAD_DIM_STEPS where they differ); written to ``tiny-<task>-qwen2-hd32``.
HEAD_DIM_SIZES = {32: dict(num_attention_heads=3, num_key_value_heads=1)}
# Steps where the head-dim variant learns slower: restate reached greedy accuracy 0.067 at 400 steps, 0.104 at 700, 0.354
# at 1200 (the 4 × 24 model: 0.446 at 400): right sometimes, as RL needs.
HEAD_DIM_STEPS = {("restate", 32): 1200}
EVAL_PROBLEMS = {"arith": None, "sums": 500, "restate": None}  # held-out problems scored for the card (None: the whole test file)


def checkpoint_name(task: str, arch: str, head_dim: int | None = None) -> str:
    """``tiny-<task>-<arch>``, with ``-hd<head_dim>`` for a head-dim variant."""
    return f"tiny-{task}-{arch}" + (f"-hd{head_dim}" if head_dim else "")


def output_folder(task: str, arch: str, head_dim: int | None = None) -> Path:
    """The default ``--out``: ``data/checkpoints/tiny-<task>-<arch>``, the built-in's folder when one is shipped under
    that name — never the task's default checkpoint of another architecture (``--arch llama`` would otherwise
    write into ``tiny-arith-qwen2``)."""
    name = checkpoint_name(task, arch, head_dim)
    return TRAINED_CHECKPOINTS.get(name, DATA_DIR / "checkpoints" / name)


def spread(values: list[int]) -> dict:
    """``{"n", "min", "median", "max"}`` of a list of token counts (None entries for an empty list)."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "min": None, "median": None, "max": None}
    return {"n": len(ordered), "min": ordered[0], "median": ordered[len(ordered) // 2], "max": ordered[-1]}


# How to open the tokenizer outside the workbench (the same ids as ``workbench.load``; tests/tasks/test_train_tiny_checkpoint.py)
TOKENIZER_NOTE = """Tokenizer: a character-level `tokenizers` file. Open it with
`PreTrainedTokenizerFast.from_pretrained(folder)` (or `workbench.load`), not `AutoTokenizer`: for a qwen2 config
`AutoTokenizer` in transformers 5 takes `Qwen2Tokenizer`, whose pre-tokenizer drops the spaces, so "sum 3 5 9 ="
reaches the model as other ids (prompts without spaces, such as the arithmetic ones, are unaffected)."""


def card_text(name: str, card: dict) -> str:
    """The checkpoint's README.md: what it is, how it was trained, how good it is, how long its responses are."""
    lengths = card["lengths"]
    rows = "\n".join(f"| {label} | {s['n']} | {s['min']} | {s['median']} | {s['max']} |" for label, s in lengths.items())
    return f"""# {name}

A tiny {card['arch']} policy ({card['parameters']:,} parameters, safetensors; opens with
`AutoModelForCausalLM.from_pretrained`) trained by supervised fine-tuning on the `{card['task']}` task
({card['task_description']}). Stopped early on purpose: RL needs a policy that is right sometimes, not always.

{TOKENIZER_NOTE}

- training command: `{card['command']}`
- SFT: {card['sft_steps']} steps × batch {card['batch_size']}, learning rate {card['learning_rate']}, seed {card['seed']},
  final loss {card['final_loss']:.3f}, {card['train_seconds']} s on {card['threads']} CPU thread(s)
- held-out greedy accuracy: **{card['greedy_test_accuracy']:.3f}** on the first {card['eval_problems']} test prompts
  (`{card['test_prompts']}`, max_new_tokens={card['max_new_tokens']}); sampled at temperature 1 (one response per
  prompt, seed 0): reward {card['sampled_reward']:.3f}, ending with EOS {card['sampled_finished']:.3f}

Response lengths in tokens (EOS included when produced), on the same held-out prompts:

| responses | n | min | median | max |
|---|---|---|---|---|
{rows}
"""


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=list(SIZES), default="arith")
    parser.add_argument("--arch", choices=["qwen2", "gpt2", "llama"], default="qwen2")
    parser.add_argument("--steps", type=int, default=None, help="default: per task and architecture, see DEFAULTS")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="default: per task and architecture, see DEFAULTS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: a tiny model gains nothing from more)")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop SFT after this many seconds (smoke runs)")
    parser.add_argument("--eval-problems", type=int, default=None, help="held-out prompts scored (default: EVAL_PROBLEMS)")
    parser.add_argument("--head-dim", type=int, choices=sorted(HEAD_DIM_SIZES), default=None,
                        help="a head-dim variant (qwen2): 32 for vLLM's CPU attention, written to tiny-<task>-qwen2-hd32")
    parser.add_argument("--out", default=None, help="output folder (default: data/checkpoints/tiny-<task>-<arch>)")
    args = parser.parse_args(argv)
    if (args.task, args.arch) not in DEFAULTS and (args.steps is None or args.lr is None):
        parser.error(f"--task {args.task} --arch {args.arch} has no default: pass --steps and --lr")
    defaults = DEFAULTS.get((args.task, args.arch), {})
    args.steps = args.steps or HEAD_DIM_STEPS.get((args.task, args.head_dim)) or defaults["steps"]
    args.lr = args.lr or defaults["lr"]
    info = task_info(args.task)
    if args.head_dim and args.arch != "qwen2":
        parser.error("--head-dim applies to --arch qwen2")
    name = checkpoint_name(args.task, args.arch, args.head_dim)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tokenizer = tiny_model(args.arch, seed=args.seed, **{**SIZES[args.task], **HEAD_DIM_SIZES.get(args.head_dim, {})})
    config = SFTConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=args.lr, seed=args.seed,
                       progress=args.max_seconds is None)
    trainer = SFTTrainer(model, tokenizer, load_problems(info.train_prompts), config)
    start = time.perf_counter()
    if args.max_seconds is None:
        history = trainer.train()
    else:  # one step at a time, stopped at the wall-clock budget
        while trainer.step < args.steps and time.perf_counter() - start <= args.max_seconds:
            history = trainer.train(trainer.step + 1)
    train_seconds = round(time.perf_counter() - start, 1)
    model.eval()
    n_eval = args.eval_problems or EVAL_PROBLEMS[args.task]
    test = load_problems(info.test_prompts)[:n_eval]
    rewards, lengths = greedy_results(model, tokenizer, test)
    sampled_rewards, sampled_lengths, sampled_finished = response_results(  # as RL samples: temperature 1, seed 0
        model, tokenizer, test, greedy=False, generator=torch.Generator().manual_seed(0), max_new_tokens=info.max_new_tokens)
    out = Path(args.out) if args.out else output_folder(args.task, args.arch, args.head_dim)
    save(model, tokenizer, out)
    reference = [len(tokenizer(p.answer, add_special_tokens=False)["input_ids"]) + 1 for p in test]
    generated = lengths.tolist()
    right = [n for n, r in zip(generated, rewards.tolist(), strict=True) if r > 0]
    wrong = [n for n, r in zip(generated, rewards.tolist(), strict=True) if r <= 0]
    card = {
        "task": args.task, "task_description": info.description, "arch": args.arch, "parameters": count_parameters(model),
        "sft_steps": len(history), "batch_size": args.batch_size, "learning_rate": args.lr, "seed": args.seed,
        "final_loss": history[-1]["loss"], "greedy_test_accuracy": float(rewards.sum()) / len(test), "eval_problems": len(test),
        "test_prompts": str(info.test_prompts.relative_to(info.test_prompts.parents[1])), "max_new_tokens": info.max_new_tokens,
        "train_seconds": train_seconds, "threads": args.threads,
        "sampled_reward": float(sampled_rewards.mean()), "sampled_finished": float(sampled_finished.float().mean()),
        "command": "python scripts/train_tiny_checkpoint.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "lengths": {"correct (reference)": spread(reference), "generated (all)": spread(generated),
                    "generated, rewarded 1": spread(right), "generated, rewarded 0": spread(wrong),
                    "sampled at temperature 1": spread(sampled_lengths.tolist())},
    }
    (out / "training.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / "README.md").write_text(card_text(name, card))
    print(json.dumps(card, indent=2))
    return card


if __name__ == "__main__":
    main()
