"""Command-line training entry point: ``python -m workbench train {ppo,grpo,dpo,sft} ...``.

The same entry point runs in one process or under ``accelerate launch`` (see ``distributed.py``).
Every bad input is an error that names the problem and the fix, with exit code 2: an unknown or
mistyped ``--set`` field, an invalid config value, a missing/unsafe checkpoint, a tokenizer with
pad == EOS, a ``--data`` file that is missing, empty, not UTF-8 or not JSON Lines, or whose rows lack
a key (``FILE:LINE: problem. fix``, read before the output folder is touched), a prompt that does not fit the model's context.

A run writes checkpoints atomically into ``--output-dir``; running the same command again resumes
from the latest one (weights, optimiser, RNG and history), so a killed run finishes with exactly the
numbers an uninterrupted run would have given. The final history goes to ``history.json``.

``--task`` picks the task (``arith``, ``sums`` or ``restate``, ``workbench.tasks.registry.TASKS``): its training prompts
(unless ``--data``), its shipped checkpoint (unless ``--model``; with ``--sampler vllm`` the checkpoint's head-dim-32 twin
``tiny-<task>-qwen2-hd32``, which vLLM's CPU attention runs) and, for PPO/GRPO, its response budget
``max_new_tokens`` (unless set): ``train grpo --task sums`` trains ``tiny-sums-qwen2`` on the scratchpad sums with
room for their 8-37-token responses. DPO needs preference pairs, which only ``arith`` ships (a ``--data`` file of
pairs is accepted with any task).

``--watch`` runs the training inside ``workbench.watch`` (policy, reference, optimiser) and writes its
``report.json`` / ``report.html`` into ``--output-dir`` (under DDP each rank watches, rank 0 merges and writes:
``tests/integration/test_watch_ranks.py``);
``--report-to tensorboard trackio wandb`` (any of them, several at once) logs every step's history (``train/…``) and,
with ``--watch``, the watch's counters (``watch/…``), step by step, through ``workbench.core.trackers``: TensorBoard
scalars in ``--output-dir/tensorboard``, trackio's local store, a W&B run (offline unless ``WANDB_MODE`` says otherwise).

``--dump-rollouts DIR`` (PPO/GRPO) writes every step's responses into ``DIR`` as they are trained on, one record per
response (``workbench.core.rollout_dump``: ids, the sampler's and the training forward's log-probs, loss mask, reward,
finish reason, policy version), one file per step: what ``python -m workbench inspect`` reads. A ``DIR`` that cannot be
made or written is refused before the model loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from workbench import tasks
from workbench.core.config_options import add_config_arguments, config_values, convert_field, count_argument
from workbench.core.errors import (
    ConfigError,
    EngineUnavailable,
    InputError,
    ModelLoadError,
    NonFiniteError,
    ParameterError,
)
from workbench.core.numbers import NOT_MEASURED, shown
from workbench.core.rollout_dump import DumpError, RolloutDumpWriter
from workbench.core.trackers import TRACKERS, finite_scalars, open_trackers, tracker_names
from workbench.experiments.checkpoints import load
from workbench.modeling.tiny import TRAINED_CHECKPOINTS
from workbench.tasks import prompt_ids
from workbench.tasks.registry import TASKS, task_info
from workbench.trainers.checkpointing import atomic_write_json
from workbench.trainers.distributed import Distributed
from workbench.trainers.registry import TRAINERS, trainer_classes
from workbench.watch.ranks import merged
from workbench.watch.watcher import watch

REPORT_TO = ("none", *TRACKERS)


def build_config(config_cls, assignments: list[str], output_dir: str | None, options: dict | None = None):
    """A config from ``--field VALUE`` options (already converted) and ``--set key=value`` strings,
    converted to each field's type; ``--set`` wins where both name a field."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    values = dict(options or {})
    for assignment in assignments:
        if "=" not in assignment:
            raise InputError(f"--set expects key=value, got {assignment!r}")
        key, text = assignment.split("=", 1)
        if key not in fields:
            raise InputError(f"{config_cls.__name__} has no field {key!r}; valid fields: {', '.join(fields)}")
        values[key] = convert_field(fields[key], text)
    if output_dir is not None:
        values["output_dir"] = output_dir
    return config_cls(**values)


def check_context_fits(model, tokenizer, prompts: list[str], max_new_tokens: int, chat_template: str = "auto") -> None:
    """Raise when a prompt plus the response budget exceeds the model's context window."""
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if limit is None:
        return

    longest = max(len(prompt_ids(tokenizer, p, chat_template)) for p in prompts)
    if longest + max_new_tokens > limit:
        raise InputError(
            f"the longest prompt has {longest} tokens and max_new_tokens={max_new_tokens}: {longest + max_new_tokens} > "
            f"the model's context of {limit} positions. Shorten or filter the prompts, or lower max_new_tokens."
        )


def load_data(kind: str, path: str | None, limit: int | None, task: str = "arith"):
    """The rows a trainer trains on: ``path`` when given, else the task's training prompts (PPO/GRPO/SFT)
    or the shipped preference pairs (DPO, arithmetic only)."""
    if kind == "dpo":
        if path is None and task != "arith":
            raise InputError(f"train dpo --task {task}: the workbench ships preference pairs for the arith task only. "
                             "Give your own pairs with --data FILE.jsonl (prompt, chosen, rejected), or use --task arith.")
        rows = tasks.load_preferences(path or tasks.TRAIN_PREFERENCES)
    else:
        rows = tasks.load_problems(path or task_info(task).train_prompts)
    return rows[:limit] if limit else rows


def task_defaults(config_cls, args) -> dict:
    """Config fields the task sets unless the command line does: ``max_new_tokens`` (PPO/GRPO)."""
    info = task_info(args.task)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    given = set(config_values(args)) | {a.split("=", 1)[0] for a in (args.set or [])}
    if "max_new_tokens" in fields and "max_new_tokens" not in given:
        return {"max_new_tokens": info.max_new_tokens}
    return {}


def default_model(task: str, sampler: str) -> str:
    """The task's shipped checkpoint; with ``--sampler vllm`` its head-dim-32 twin (``tiny-<task>-qwen2-hd32``), whose
    shapes vLLM's CPU attention runs."""
    checkpoint = task_info(task).checkpoint
    if sampler != "vllm":
        return checkpoint
    if f"{checkpoint}-hd32" not in TRAINED_CHECKPOINTS:
        raise InputError(f"--sampler vllm --task {task}: no engine checkpoint ships for this task ({checkpoint} has head_dim "
                         f"24, which vLLM's CPU attention does not run). Train one with `python scripts/train_tiny_checkpoint.py "
                         f"--task {task} --head-dim 32` and pass --model data/checkpoints/{checkpoint}-hd32")
    return f"{checkpoint}-hd32"


def check_dump_folder(config) -> None:
    """``--dump-rollouts DIR``: refuse a folder that cannot be made or written (a file there, no permission) before the
    model loads; the trainer writes into it from its first step."""
    folder = getattr(config, "dump_rollouts", None)
    if folder is None:
        return
    try:
        RolloutDumpWriter(str(folder), format=config.dump_format)
    except DumpError as exc:
        raise InputError(str(exc)) from None


def run(args) -> dict:
    config_cls, trainer_cls = trainer_classes(args.trainer)
    config = build_config(config_cls, args.set or [], args.output_dir, {**task_defaults(config_cls, args), **config_values(args)})
    config.progress = config.progress and not args.quiet
    check_dump_folder(config)
    data = load_data(args.trainer, args.data, args.limit, args.task)
    model = args.model or default_model(args.task, getattr(config, "sampler", "workbench"))
    policy, tokenizer = load(model, device=args.device, pad_token=args.pad_token, verbose=not args.quiet)
    if args.trainer in ("ppo", "grpo"):
        check_context_fits(policy, tokenizer, [p.prompt for p in data], config.max_new_tokens, config.chat_template)
    trainer = trainer_cls(policy, tokenizer, data, config)
    if not args.quiet and hasattr(trainer, "learning_rate") and isinstance(trainer.learning_rate, float):
        print(f"learning rate {trainer.learning_rate:.3g} (config: {config.learning_rate!r}); precision {config.precision}")
    with trainer.hold_output_dir():  # the folder is this run's from its first file (TensorBoard's) to its report
        return _train_and_report(args, trainer, config, policy, tokenizer, model)


def _train_and_report(args, trainer, config, policy, tokenizer, model: str) -> dict:
    """``run``'s training and the files it writes besides the checkpoints: TensorBoard scalars, ``history.json``, the
    watch report."""
    names = tracker_names(args.report_to) if trainer.is_main_process else []
    trackers = open_trackers(names, output_dir=config.output_dir, config=config.to_dict(),
                             run_name=f"train-{args.trainer}" + (f"-{Path(config.output_dir).name}" if config.output_dir else ""))
    if not args.quiet:
        for where in trackers.where:
            print(f"logging to {where}")
    observer = watched(trainer, policy, tokenizer) if args.watch else None
    on_step = step_logger(trackers, observer) if trackers else None
    try:
        if observer is None:
            history = trainer.train(on_step=on_step)
        else:
            with observer:
                history = trainer.train(on_step=on_step)
    finally:
        trackers.close()
    summary = {"trainer": args.trainer, "task": args.task, "model": model, "config": config.to_dict(), "history": history}
    if config.output_dir and trainer.is_main_process:
        atomic_write_json(Path(config.output_dir) / "history.json", summary)
    if observer is not None:
        report = merged(observer.report())  # every rank calls it; rank 0 gets the merged report
        if report is not None:
            summary["watch"] = report.to_dict()
            if not args.quiet:
                print(report)
            if config.output_dir:
                print(f"watch report: {report.write(config.output_dir, title=f'workbench.watch: train {args.trainer}')[1]}")
    return summary


def watched(trainer, policy, tokenizer):
    """A ``watch`` of the trainer's policy, reference and optimiser (accelerate's wrapper unwrapped)."""
    optimizer = getattr(trainer, "optimizer", None) or getattr(trainer, "policy_optimizer", None)
    optimizer = getattr(optimizer, "optimizer", optimizer)
    return watch(policy, tokenizer=tokenizer, reference=getattr(trainer, "reference", None), optimizer=optimizer)


def step_logger(trackers, observer=None):
    """``train``'s ``on_step``: each step's history record as ``train/<name>`` (all but ``step``, the x axis) and the
    watch's counters as ``watch/<name>``, to every tracker of ``trackers`` (``workbench.core.trackers.Trackers``)."""

    def on_step(record: dict) -> None:
        scalars = {f"train/{k}": v for k, v in finite_scalars(record).items() if k != "step"}
        if observer is not None:
            scalars.update(observer.report().scalars("watch/"))
        trackers.log(scalars, record["step"])

    return on_step


# Why a step leaves a history value undefined (NaN): the done line says so instead of printing "nan".
UNDEFINED_AT_A_STEP = {
    "ratio_deviation_later": "one optimisation step per rollout batch: no later step",
    "length_correct": "no correct response in the last batch",
    "length_incorrect": "no incorrect response in the last batch",
}


def done_line(last: dict) -> str:
    """The last step's numbers, "n/a (<why>)" where one is undefined, never "nan"."""
    return "done: " + ", ".join(f"{k}={shown(v, '.4g', UNDEFINED_AT_A_STEP.get(k, NOT_MEASURED))}"
                                for k, v in last.items() if isinstance(v, float))


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=tuple(TASKS), default="arith",
                        help="arith (answers of 1-3 characters), sums (scratchpad responses of 8-37 tokens) or restate "
                             "(answers restated 0-3 times): the default data, checkpoint and max_new_tokens")
    parser.add_argument("--model", default=None,
                        help="built-in name or local checkpoint folder (default: the task's checkpoint, tiny-arith-qwen2, "
                             "tiny-sums-qwen2 or tiny-restate-qwen2)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1, …")
    parser.add_argument("--pad-token", default="auto",
                        help="auto: the tokenizer's, else a safe choice (printed; never EOS); or a token, added if new")
    parser.add_argument("--output-dir", default=None, help="checkpoints and history; rerun to resume")
    parser.add_argument("--data", default=None, help="JSONL prompts (ppo/grpo/sft) or preference pairs (dpo)")
    parser.add_argument("--limit", type=count_argument, default=None, help="use only the first N rows of the data")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="set a config field (repeatable; same as --KEY VALUE)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--watch", action="store_true",
                        help="run inside workbench.watch; its report.json/report.html go into --output-dir")
    parser.add_argument("--report-to", nargs="+", choices=REPORT_TO, default=["none"], metavar="TRACKER",
                        help="tensorboard, trackio, wandb (several at once) or none: the history (and --watch's counters) "
                             "step by step; trackio and wandb need the trackers extra")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``train {ppo,grpo,dpo,sft}``: one sub-command per trainer, each with its config's fields as
    documented options (``python -m workbench train grpo --help``)."""
    sub = parser.add_subparsers(dest="trainer", required=True, metavar="{" + ",".join(TRAINERS) + "}")
    for kind in TRAINERS:
        config_cls, trainer_cls = trainer_classes(kind)
        summary = (sys.modules[trainer_cls.__module__].__doc__ or "").strip().splitlines()[0]
        trainer = sub.add_parser(kind, help=summary, description=f"{summary} Every config field below is an option; "
                                 "the pitfall switches default to the fix.")
        add_common_arguments(trainer)
        add_config_arguments(trainer, config_cls, skip=("output_dir", "progress"))


def main(args) -> int:
    try:
        summary = run(args)
        Distributed.current().close()
    except (InputError, ConfigError, ModelLoadError, ParameterError, FileNotFoundError) as exc:
        where = f" (set by --{exc.field} VALUE or --set {exc.field}=VALUE)" if getattr(exc, "field", None) else ""
        print(f"error: {exc}{where}", file=sys.stderr)
        Distributed.leave()
        return Distributed.exit_launched(2)  # raised before training: nothing written, nothing to flush but the streams
    except (ValueError, EngineUnavailable) as exc:  # e.g. an empty dataset; EngineError, EngineUnavailable: --sampler vllm
        print(f"error: {exc}", file=sys.stderr)
        Distributed.leave()
        return 2
    except NonFiniteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        Distributed.leave()
        return 1
    last = summary["history"][-1] if summary["history"] else {}
    if int(os.environ.get("RANK", "0")) == 0:
            print(done_line(last))
    return 0
