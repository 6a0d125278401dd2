"""Training comparisons: the same trainer run with the bug on and off over seeds (in a process pool when asked).

A pitfall notebook that trains (01, 03, 04, 06, 07, 11, 12, 13) asks one question: does the switch
change what training measures, by more than the run-to-run noise? ``train_variants`` runs one
trainer per variant (a label → config switches) over one or more seeds, from the same checkpoint,
on the same prompts; ``experiments.statistics.effect`` compares the variants' final values and says
whether the gap is larger than the noise, ``viz.plots.plot_bands`` draws them.

Training runs only tell something when the policy *learns*: ``learning_settings(kind)`` holds, in
one place, the settings measured to raise held-out greedy accuracy of the shipped tiny policy
(docs/LEARNING.md), and ``train_variants(..., problems=None, held_out=N)`` trains on every training
prompt and scores N fixed held-out prompts greedily before and after each run (``heldout_accuracy``
in the run's last record; ``experiments.evaluation``); ``statistics.gain`` says whether a variant's
held-out accuracy rose by more than the seed noise.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os

import torch

from workbench.core import progress, worker_processes
from workbench.core.errors import ParameterError
from workbench.experiments.checkpoints import load
from workbench.experiments.evaluation import held_out_accuracy, held_out_pair_logps
from workbench.modeling.models import count_parameters
from workbench.tasks import TEST_PREFERENCES, TRAIN_PREFERENCES, load_preferences, load_problems, rl_problems, task_info
from workbench.trainers.base import TINY_MODEL_PARAMETERS
from workbench.trainers.registry import TRAINERS

# Settings measured to raise held-out greedy accuracy of tiny-arith-qwen2 (docs/LEARNING.md, 3 seeds each).
# "full": scripts/learning_settings.py's reference runs; "notebook": the cheaper variant the training
# notebooks use to stay within the catalogue's time budget (measured to still learn, numbers in the doc).
LEARNING_SETTINGS = {
    ("grpo", "full"): dict(learning_rate=1e-5, prompts_per_step=32, num_generations=8, steps=60, max_new_tokens=6,
                           loss_agg="seq-mean-token-mean"),
    ("ppo", "full"): dict(learning_rate=1e-5, prompts_per_step=64, steps=60, max_new_tokens=6),
    ("grpo", "notebook"): dict(learning_rate=2e-5, prompts_per_step=32, num_generations=8, steps=30, max_new_tokens=6,
                               loss_agg="seq-mean-token-mean"),
    ("ppo", "notebook"): dict(learning_rate=1.5e-5, prompts_per_step=48, steps=40, max_new_tokens=6),
}
COMPARED = ("ppo", "grpo", "dpo")  # the trainers (of trainers.registry) whose pitfall switches the notebooks compare
HELD_OUT = 400  # held-out test prompts scored greedily before and after a run (docs/LEARNING.md)


def learning_settings(kind: str, budget: str = "notebook", task: str = "arith", **overrides) -> dict:
    """Trainer settings under which ``kind`` ("grpo", "ppo") raises held-out accuracy; ``overrides``
    replace single entries (e.g. ``steps=3`` in smoke mode). Train with ``train_variants(...,
    problems=None, held_out=HELD_OUT, **settings)``: all training prompts, held-out accuracy recorded.
    The settings were measured on the arithmetic task; another ``task`` gets its own ``max_new_tokens``
    (``tasks.registry``) and the rest unchanged (not measured there)."""
    if (kind, budget) not in LEARNING_SETTINGS:
        raise ValueError(f"learning_settings({kind!r}, {budget!r}): kind must be 'grpo' or 'ppo' and budget 'full' or 'notebook'")
    task_length = {} if task == "arith" else {"max_new_tokens": task_info(task).max_new_tokens}
    return {**LEARNING_SETTINGS[kind, budget], **task_length, **overrides}


def train_variants(kind: str, model: str, variants: dict[str, dict], *, steps: int, seeds=(0,), problems: int | None = 64,
                   held_out: int = 0, before=None, processes: int = 1, device: str = "auto", pad_token: str | None = "auto",
                   return_models: bool = False, task: str = "arith", **common):
    """``{label: [history of seed 0, history of seed 1, …]}`` for ``kind`` in ("ppo", "grpo", "dpo") (``trainers.registry``).

    Every run loads ``model`` afresh; ``before(policy)`` (optional) edits it before training (e.g.
    switch dropout on); ``common`` goes to every config, ``variants[label]`` to that variant's.
    ``problems``: train on the first that many training prompts (DPO: preference pairs), or on all
    of them (None: the learning settings). ``held_out`` > 0 scores the first ``held_out`` test prompts greedily (eval
    mode) before training (once per call: the same weights for every run, ``_held_out_start``) and after each run, and
    adds ``heldout_accuracy_start``, ``heldout_accuracy`` and ``heldout_gain`` to the run's last record.
    ``processes`` > 1 runs the (variant, seed) pairs in that many worker processes (``core.worker_processes``: forks
    of a clean copy of a catalogue kernel, spawned elsewhere), each with its share of the CPU threads (``before`` must
    then be picklable: a module-level function or a ``functools.partial`` of one). Results do not depend on
    ``processes``, nor does the caller's global torch generator afterwards (each run seeds it for its dropout masks; in
    this process under ``fork_rng``). ``device`` and ``pad_token`` go to ``workbench.experiments.checkpoints.load`` (the
    notebooks' parameters of those names).
    ``return_models``: return ``(runs, {label: trained policy of the first seed})`` instead.
    ``task`` (a name of ``tasks.registry.TASKS``): whose train/test prompts and reward the runs use; PPO/GRPO
    decode the task's ``max_new_tokens`` unless ``common`` or a variant sets it. DPO has arithmetic pairs only.
    """
    if kind not in COMPARED:
        raise ValueError(f"kind={kind!r}: choose one of {sorted(COMPARED)}")
    task_info(task)  # ParameterError naming the tasks, before any run starts
    if kind == "dpo" and task != "arith":
        raise ParameterError(f"train_variants('dpo', task={task!r}): preference pairs exist for the arithmetic task only "
                             "(data/arith_preferences_*.jsonl). Use task='arith' for DPO, or 'ppo'/'grpo' for this task.")
    loading = {"device": device, "pad_token": pad_token}
    jobs = [(label, seed) for label in variants for seed in seeds]
    keep = [return_models and seed == seeds[0] for _, seed in jobs]
    bar_title = f"{kind}: {len(variants)} variant(s) × {len(seeds)} seed(s)"
    if processes > 1 and len(jobs) > 1:
        threads = max(1, (os.cpu_count() or 1) // processes)
        with worker_processes.pool(min(processes, len(jobs))) as pool:
            # the untrained checkpoint's held-out scores: one job (every run would compute the same numbers), first
            before_scores = pool.submit(_held_out_start, kind, model, before, threads, loading, held_out, task) if held_out > 0 else None
            step_files = progress.StepFiles(len(jobs)) if progress.bars_shown() else None
            futures = [pool.submit(_train_one, kind, model, {**common, **variants[label]}, steps, seed, problems, before, threads,
                                   loading, held_out, k, task, step_files.paths[index] if step_files else None)
                       for index, ((label, seed), k) in enumerate(zip(jobs, keep, strict=True))]
            with progress.bar(len(jobs) * steps, bar_title, unit="step") as bar:
                pending = set(futures)
                while pending:
                    _, pending = concurrent.futures.wait(pending, timeout=0.5)
                    if step_files is not None:
                        bar.update(step_files.done() - bar.n)
            if step_files is not None:
                step_files.close()
            results = [f.result() for f in futures]
            start = before_scores.result() if before_scores is not None else None
    else:  # the caller's global generators left as a worker process leaves them: untouched (each run seeds its own)
        with torch.random.fork_rng(), progress.bar(len(jobs) * steps, bar_title, unit="step") as bar:
            start = _held_out_start(kind, model, before, None, loading, held_out, task) if held_out > 0 else None
            results = [_train_one(kind, model, {**common, **variants[label]}, steps, seed, problems, before, None, loading,
                                  held_out, k, task, on_step=lambda record: bar.update(1))
                       for (label, seed), k in zip(jobs, keep, strict=True)]
    runs: dict[str, list[list[dict]]] = {label: [] for label in variants}
    models = {}
    for (label, _), (history, state, end) in zip(jobs, results, strict=True):
        if start is not None and history:
            _record_held_out(history[-1], start, end)
        runs[label].append(history)
        if state is not None:
            models[label], _ = load(model, **loading)
            models[label].load_state_dict(state)
    return (runs, models) if return_models else runs


def _train_one(kind: str, model: str, switches: dict, steps: int, seed: int, problems: int | None, before=None,
               threads: int | None = None, loading: dict | None = None, held_out: int = 0,
               keep_model: bool = False, task: str = "arith", step_file: str | None = None,
               on_step=None) -> tuple[list[dict], dict | None, dict | None]:
    """One run: its history, its trained weights when ``keep_model``, and its held-out scores after training when
    ``held_out`` (``_record_held_out`` puts them in the last record). ``threads`` None (a run in
    this process): a tiny model on the CPU runs on one thread, the caller's setting restored after —
    its matrices are too small to gain from two, and two threads on a shared machine wait on each
    other (measured: a 3-step PPO pair 1.5 s on one thread, 17–34 s on two beside another job). Progress: ``on_step``
    (this process) or ``step_file`` (a worker: ``progress.StepFiles``) after each step."""
    with _callers_threads():
        Config, Trainer = TRAINERS[kind]
        policy, tokenizer = _loaded(model, before, threads, loading)
        info = task_info(task)
        if kind != "dpo":  # the task's decoding length unless the caller chose one (arith: 8, the configs' default)
            switches = {"max_new_tokens": info.max_new_tokens, **switches}
        config = Config(steps=steps, seed=seed, progress=False, **switches)
        torch.manual_seed(seed)  # the global generator draws dropout masks (P7's bug variant): same seed, same run
        if kind == "dpo":
            train = load_preferences(TRAIN_PREFERENCES)[:problems]
        else:
            train = load_problems(info.train_prompts) if problems is None else rl_problems(problems, task)
        if step_file is not None:
            def on_step(record):
                progress.StepFiles.report(step_file, record["step"] + 1)
        history = Trainer(policy, tokenizer, train, config).train(on_step=on_step)
        end = _held_out_scores(kind, policy, tokenizer, held_out, task) if held_out > 0 and history else None
        return history, ({k: v.detach().cpu() for k, v in policy.state_dict().items()} if keep_model else None), end


@contextlib.contextmanager
def _callers_threads():
    """The caller's torch thread setting, restored when the block ends (a run sets its own: ``_loaded``)."""
    previous = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(previous)



def is_tiny_on_cpu(model) -> bool:
    """A model under ``TINY_MODEL_PARAMETERS`` on the CPU: its operations are too small for a second torch thread to
    repay the synchronisation, which a shared CPU turns into spinning."""
    return next(model.parameters()).device.type == "cpu" and count_parameters(model) < TINY_MODEL_PARAMETERS


@contextlib.contextmanager
def one_thread_if_tiny(model):
    """One torch thread while a tiny model works on the CPU (``is_tiny_on_cpu``), as ``train_variants`` runs one; the
    caller's setting is restored."""
    previous = torch.get_num_threads()
    try:
        if is_tiny_on_cpu(model):
            torch.set_num_threads(1)
        yield
    finally:
        torch.set_num_threads(previous)

def _loaded(model, before, threads, loading):
    """``model`` loaded as a run loads it: ``threads`` set (None: one for a tiny model on the CPU), ``before`` applied."""
    if threads is not None:
        torch.set_num_threads(threads)
    policy, tokenizer = load(model, **(loading or {}))
    if threads is None and is_tiny_on_cpu(policy):
        torch.set_num_threads(1)
    if before is not None:
        before(policy)
    return policy, tokenizer


def _held_out_start(kind, model, before, threads, loading, held_out, task) -> dict:
    """The held-out scores of the checkpoint before any training (after ``before``), computed once per
    ``train_variants`` call, in a worker like the runs' when they have workers: every run would compute the same
    numbers (a greedy evaluation of the same weights; nothing drawn), and paying for it in each run would cost
    1.5 CPU-seconds on the sums task, six times per training notebook."""
    with _callers_threads():
        policy, tokenizer = _loaded(model, before, threads, loading)
        return {f"{k}_start": v for k, v in _held_out_scores(kind, policy, tokenizer, held_out, task).items()}


def _held_out_scores(kind, policy, tokenizer, held_out, task) -> dict:
    """``heldout_accuracy`` on the first ``held_out`` test prompts of ``task``; DPO: the held-out pairs' log-probs too."""
    scores = {"heldout_accuracy": held_out_accuracy(policy, tokenizer, load_problems(task_info(task).test_prompts)[:held_out])}
    if kind == "dpo":  # what DPO does to the answers it is shown, on pairs it never saw
        scores.update(held_out_pair_logps(policy, tokenizer, load_preferences(TEST_PREFERENCES)[:held_out]))
    return scores


def _record_held_out(last: dict, start: dict, end: dict) -> None:
    """The run's last record gets ``heldout_accuracy_start``, ``heldout_accuracy``, ``heldout_gain`` and (DPO) the
    held-out pairs' log-probs before (``*_start``) and after training."""
    last.update(heldout_accuracy_start=start["heldout_accuracy_start"], heldout_accuracy=end["heldout_accuracy"],
                heldout_gain=end["heldout_accuracy"] - start["heldout_accuracy_start"])
    last.update({k: v for k, v in start.items() if k != "heldout_accuracy_start"})
    last.update({k: v for k, v in end.items() if k != "heldout_accuracy"})


def first_seed(runs: dict[str, list[list[dict]]]) -> dict[str, list[dict]]:
    """``{label: history}`` of the first seed (what ``plots.plot_curves`` draws)."""
    return {label: histories[0] for label, histories in runs.items()}


def first_divergence(a: list[dict], b: list[dict], key: str, tolerance: float = 1e-9) -> int | None:
    """The first step at which two runs' ``key`` differ by more than ``tolerance`` (None: never)."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if abs(x[key] - y[key]) > tolerance:
            return step
    return None
