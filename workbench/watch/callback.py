"""``WatchCallback``: ``workbench.watch`` inside any ``transformers.Trainer`` (TRL's trainers included).

``trainer = GRPOTrainer(..., callbacks=[WatchCallback()])`` (or ``trainer.add_callback(cb)``):

* at train begin it attaches a ``watch`` to the trainer's model (unwrapped from DDP/accelerate), its
  tokenizer (``processing_class``), its optimiser (unwrapped from accelerate's wrapper) and, when the trainer
  holds one, its reference model (``ref_model``, TRL's name; or the ``reference=`` given here);
* at every log it adds the watch's counters and findings as scalars (``watch/…``, ``Report.scalars``) to the
  trainer's own ``logs``, so they reach whatever ``report_to`` is set and ``state.log_history``; to be seen
  by the reporting callbacks it moves itself to the front of the trainer's callback list;
* at train end it detaches and writes ``report.json`` and ``report.html`` into ``args.output_dir`` (rank 0,
  the ranks' reports merged under DDP); ``cb.report()`` returns the report at any time.

``WatchCallback(dump_rollouts=DIR)`` also writes a rollout dump that ``python -m workbench inspect DIR`` reads
(``workbench.core.rollout_dump``: one record per completion, one file per generation batch) from a TRL
``GRPOTrainer``: its ``_generate_and_score_completions`` is wrapped on the trainer instance (TRL hands callbacks no
batch), and each batch it returns is written — prompt and completion ids, the loss mask (``completion_mask``), the
reward (the reward functions' weighted sum, from the trainer's completion log), ``finish`` (``stop`` when the
completion holds an EOS), ``temperature``, group (``num_generations`` consecutive completions) and ``step`` =
``policy_version`` = the global step that generated it. Per-token log-probs are written where TRL computed them:
``trainer_logprobs`` = ``old_per_token_logps`` (off-policy steps, or with vLLM), ``rollout_logprobs`` =
``sampling_per_token_logps`` (vLLM's, with its importance-sampling correction); otherwise None, since TRL's
on-policy step never computes π_old separately. One process only (another rank's batch is not written).

This module imports transformers (the watch's core does not): ``workbench.watch.WatchCallback`` loads it on use.
"""

from __future__ import annotations

import sys
import warnings

import torch
from transformers import TrainerCallback

from workbench.core.rollout_dump import RolloutDumpWriter, step_records
from workbench.watch.ranks import merged
from workbench.watch.report import Report
from workbench.watch.watcher import Watch


def _unwrap(obj, attribute: str):
    """DDP's ``.module``, accelerate's ``AcceleratedOptimizer.optimizer``: the object that really runs."""
    while obj is not None and hasattr(obj, attribute) and getattr(obj, attribute) is not obj:
        inner = getattr(obj, attribute)
        if inner is None:
            break
        obj = inner
    return obj


class WatchCallback(TrainerCallback):
    """Watch a ``transformers.Trainer``'s run; see the module doc. ``deep=True``: the gradient checks too."""

    def __init__(self, deep: bool = False, reference=None, write_report: bool = True, prefix: str = "watch/",
                 dump_rollouts: str | None = None, dump_format: str = "jsonl"):
        self.deep, self.reference, self.write_report, self.prefix = deep, reference, write_report, prefix
        self.watch: Watch | None = None
        self.paths: tuple[str, str] | None = None
        self._final: Report | None = None
        # the folder is checked here, before training starts (DumpError names it and the fix)
        self.dump = None if dump_rollouts is None else RolloutDumpWriter(dump_rollouts, format=dump_format)
        self._dumped_batches = 0

    def report(self) -> Report:
        """The findings so far (the final, rank-merged report after train end)."""
        if self._final is not None:
            return self._final
        return self.watch.report() if self.watch is not None else Report()

    def on_train_begin(self, args, state, control, model=None, processing_class=None, optimizer=None, **kwargs):
        trainer = self._calling_trainer()
        if trainer is not None:  # first in line, so the reporting callbacks see the scalars this one adds
            handler = trainer.callback_handler
            handler.callbacks = [self] + [callback for callback in handler.callbacks if callback is not self]
        if self.dump is not None:
            self._wrap_generation(trainer, state)
        reference = self.reference if self.reference is not None else getattr(trainer, "ref_model", None)
        model = _unwrap(model if model is not None else getattr(trainer, "model", None), "module")
        if model is None:
            return
        self._final = None
        self.watch = Watch(model, tokenizer=processing_class, reference=_unwrap(reference, "module"),
                           optimizer=_unwrap(optimizer, "optimizer"), deep=self.deep)
        self.watch.__enter__()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.watch is None or logs is None:
            return
        scalars = self.watch.report().scalars(self.prefix)
        logs.update(scalars)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(scalars)  # the trainer appended this log's copy just before on_log

    def on_train_end(self, args, state, control, **kwargs):
        if self.watch is None:
            return
        self.watch.close()
        self._final = merged(self.watch.report())
        if self._final is not None and self.write_report and args.output_dir and state.is_world_process_zero:
            self.paths = self._final.write(args.output_dir, title=f"workbench.watch report: {args.output_dir}")
        if self._final is None:  # a rank other than 0: its own part
            self._final = self.watch.report()

    def _wrap_generation(self, trainer, state) -> None:
        """Wrap the trainer's ``_generate_and_score_completions`` (on the instance) so each batch it returns is dumped."""
        generate = getattr(trainer, "_generate_and_score_completions", None)
        if generate is None:
            warnings.warn(f"WatchCallback(dump_rollouts=...): {type(trainer).__name__} has no _generate_and_score_completions "
                          "(TRL's GRPOTrainer and RLOOTrainer have it); no rollout dump is written", stacklevel=2)
            return
        if getattr(trainer.accelerator, "num_processes", 1) > 1:
            warnings.warn("WatchCallback(dump_rollouts=...): rollout dumps are written by one process only; "
                          "this run has several, so no dump is written", stacklevel=2)
            return
        self.dump.start(state.global_step)

        def generate_and_dump(*args, **kwargs):
            output = generate(*args, **kwargs)
            if trainer.model.training:  # training batches, not evaluation ones
                records = self.batch_records(trainer, output)
                if records is None:
                    warnings.warn("WatchCallback(dump_rollouts=...): this batch's rewards are not in the trainer's "
                                  "completion log (trainer._logs['rewards']); the batch is not dumped", stacklevel=2)
                else:
                    self.dump.write_step(trainer.state.global_step, records)
                    self._dumped_batches += 1
            return output

        trainer._generate_and_score_completions = generate_and_dump

    @staticmethod
    def batch_records(trainer, output: dict) -> list[dict] | None:
        """The dump records of one batch ``_generate_and_score_completions`` returned (see the module doc); None when
        the trainer's completion log does not hold this batch's rewards."""
        completion_ids = output["completion_ids"].detach().cpu()
        eos_ids = torch.tensor(list(getattr(trainer, "eos_token_ids", None) or [trainer.processing_class.eos_token_id]))
        pad = trainer.processing_class.pad_token_id
        is_eos = torch.isin(completion_ids, eos_ids)
        finished = is_eos.any(dim=1)
        positions = torch.arange(1, completion_ids.size(1) + 1)
        first_eos = is_eos.int().argmax(dim=1) + 1
        # a completion without EOS ends at its last token that is not padding, or its mask's last 1 (a generated
        # token may have the pad id); TRL's mask_truncated_completions zeroes that mask, so both are read
        kept = completion_ids != pad if pad is not None and pad not in eos_ids.tolist() else torch.ones_like(is_eos)
        masked_in = output["completion_mask"].detach().cpu().bool()
        unfinished = torch.maximum((kept * positions).amax(dim=1), (masked_in * positions).amax(dim=1))
        lengths = torch.where(finished, first_eos, unfinished)
        response_mask = (positions[None, :] <= lengths[:, None]).int()
        rows = len(completion_ids)
        logs = getattr(trainer, "_logs", {}).get("rewards", {})
        weights = getattr(trainer, "reward_weights", None)
        per_function = [list(values)[-rows:] for values in logs.values()]
        if per_function and all(len(values) == rows for values in per_function):
            table = torch.tensor(per_function, dtype=torch.float64).T  # (rows, functions)
            weights = torch.ones(table.size(1), dtype=torch.float64) if weights is None else weights.detach().cpu().double()
            reward = (table * weights[None, :]).nansum(dim=1)
        else:
            return None
        step = trainer.state.global_step
        return step_records(
            step, prompt_ids=output["prompt_ids"], prompt_mask=output["prompt_mask"], response_ids=completion_ids,
            response_mask=response_mask, reward=reward, finished=finished, loss_mask=output["completion_mask"].detach().cpu(),
            rollout_logprobs=_cpu(output.get("sampling_per_token_logps")), trainer_logprobs=_cpu(output.get("old_per_token_logps")),
            group_size=getattr(trainer, "num_generations", 1), temperature=getattr(trainer, "temperature", None),
            policy_version=step,
        )

    def _calling_trainer(self):
        """The ``Trainer`` whose callback handler is calling this callback (found on the call stack)."""
        frame = sys._getframe(1)
        while frame is not None:
            owner = frame.f_locals.get("self")
            handler = getattr(owner, "callback_handler", None)
            if handler is not None and self in getattr(handler, "callbacks", ()):
                return owner
            frame = frame.f_back
        return None


def _cpu(tensor):
    return None if tensor is None else tensor.detach().float().cpu()
