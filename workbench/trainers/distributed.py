"""Scale-out with Hugging Face accelerate: the same trainers in several processes.

Launch the training entry point under accelerate (DDP) or with FSDP2 (``--use_fsdp --fsdp_version 2``)::

    accelerate launch --multi_gpu --num_processes 2 -m workbench train grpo --output-dir runs/ddp
    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 -m workbench train grpo --output-dir runs/fsdp
    # on a CPU-only machine both commands run two CPU processes over gloo

FSDP: accelerate 1.15 turns ``--use_fsdp`` into plain DDP on a CPU without a word (its state keeps ``MULTI_CPU``); so
this module reads accelerate's own variables (``ACCELERATE_USE_FSDP``, ``FSDP_VERSION``) and shards the trained models
itself with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``: each decoder layer, then the whole model), which runs
over gloo on a CPU. FSDP1 (``--fsdp_version 1``, accelerate's default) is refused by name: it would silently be DDP on a
CPU, and on GPUs it has not been run here. Checkpoints hold full tensors whatever the strategy (the sharded weights
and optimiser state are gathered first), so a run resumes in another number of processes or without FSDP.

Design — *generation replicated, training sharded*: every process samples the whole rollout
batch with the same seeded generator (identical, so no broadcast is needed), then computes the
loss and gradients on its own contiguous shard of rows; DDP (or FSDP2) averages the gradients. Loss
normalisers are reduced over processes first, so a token-mean is the mean over the *global* batch
(pitfall P10 again): the result equals a single-process run with the same global batch up to float
noise. Only the main process writes checkpoints and histories.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import torch

from workbench.core.errors import ConfigError
from workbench.trainers import fsdp_sharding


class Distributed:
    """The process group as the trainers see it (a no-op in a single process)."""

    _current: Distributed | None = None

    def __init__(self) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.accelerator = None
        self.rank = 0
        self.fsdp = self.world_size > 1 and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if self.fsdp and os.environ.get("FSDP_VERSION", "1") != "2":
            raise ConfigError(
                f"FSDP version {os.environ.get('FSDP_VERSION', '1')} (accelerate launch --use_fsdp without --fsdp_version 2): "
                "the workbench shards with FSDP2 only. On a CPU accelerate 1.15 would run FSDP1 as plain DDP without a "
                "word. Launch with --use_fsdp --fsdp_version 2, or --multi_gpu for DDP.")
        if self.world_size > 1:
            from accelerate import Accelerator  # accelerate: peer environments only

            self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
            self.rank = self.accelerator.process_index

    @property
    def strategy(self) -> str:
        """``single``, ``ddp`` or ``fsdp2``."""
        return "fsdp2" if self.fsdp else "ddp" if self.enabled else "single"

    @classmethod
    def current(cls) -> Distributed:
        if cls._current is None:
            cls._current = cls()
        return cls._current

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    def prepare(self, model, optimizer):
        """``(model used for training forwards, optimizer)``: DDP-wrapped when distributed; under FSDP2 ``model`` itself
        sharded in place (and returned) with a new optimiser of ``optimizer``'s class and settings over its sharded
        parameters (the old one's parameters are gone)."""
        if not self.enabled:
            return model, optimizer
        if self.fsdp:
            return fsdp_sharding.shard(model, optimizer)
        return self.accelerator.prepare(model, optimizer)

    def full_state(self, modules: dict, optimizers: dict, owners: dict) -> tuple[dict, dict]:
        """Full (unsharded) state dicts of ``modules`` and ``optimizers`` (``owners``: optimiser name → its module),
        gathered from every process under FSDP2 (a collective: every process calls it); the objects themselves elsewhere."""
        if not self.fsdp:
            return modules, optimizers
        return fsdp_sharding.full_state(modules, optimizers, owners)

    def loaders(self, modules: dict, optimizers: dict, owners: dict) -> tuple[dict, dict]:
        """What ``load_checkpoint`` loads a full checkpoint into: the objects themselves, under FSDP2 stand-ins that
        put each process's shard of the full tensors into the sharded module or optimiser."""
        if not self.fsdp:
            return modules, optimizers
        return fsdp_sharding.loaders(modules, optimizers, owners)

    def shard(self, rows: torch.Tensor | list) -> torch.Tensor | list:
        """This process's contiguous share of ``rows`` (their number must divide evenly)."""
        if not self.enabled:
            return rows
        if len(rows) % self.world_size:
            raise ValueError(
                f"{len(rows)} rows cannot be split evenly over {self.world_size} processes; make the batch "
                f"(or mini-batch) size a multiple of the number of processes"
            )
        size = len(rows) // self.world_size
        return rows[self.rank * size : (self.rank + 1) * size]

    def sum(self, value) -> torch.Tensor:
        """All-reduce sum of a number or tensor (returned as a float64 tensor)."""
        tensor = torch.as_tensor(value, dtype=torch.float64).clone()
        if self.enabled:
            torch.distributed.all_reduce(tensor)
        return tensor

    def mean(self, value: float) -> float:
        return float(self.sum(value)) / self.world_size

    def max(self, value: float) -> float:
        """All-reduce maximum of a number."""
        tensor = torch.as_tensor(value, dtype=torch.float64).clone()
        if self.enabled:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor)

    def close(self) -> None:
        """Leave the process group cleanly (gloo aborts at exit otherwise)."""
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    @staticmethod
    def exit_launched(code: int) -> int:
        """``code`` as this process's exit code. In a launched group (``WORLD_SIZE`` > 1) the process ends here, streams
        flushed, without the interpreter's teardown: after the group was left, torch's C++ teardown at exit can still
        abort (SIGABRT, "terminate called without an active exception"), and the launcher then reports that crash as the
        root cause instead of the error (the refusal of a held output folder, exit 2, then comes out as -6). For errors
        raised before anything is written (nothing buffered to lose). Returns ``code`` elsewhere."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return code
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    @staticmethod
    def leave() -> None:
        """Leave the process group without waiting for the others — an error's way out, where they may never come; the
        process then exits with its own code instead of gloo's abort at exit (-6). Nothing when no group is up."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# ---- a real CPU process group, for measurements (pitfalls P32, P33) -------------------------------
def _to_plain(value):
    """A result as JSON-ready data: tensors as ``{"__tensor__": nested list, "dtype": name}``, tuples as lists."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {key: _to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(item) for item in value]
    return value


def _from_plain(value):
    """``_to_plain``'s inverse (tuples come back as lists)."""
    if isinstance(value, dict):
        if "__tensor__" in value:
            return torch.tensor(value["__tensor__"], dtype=getattr(torch, value["dtype"]))
        return {key: _from_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_from_plain(item) for item in value]
    return value


def _group_store(rank: int, world_size: int, ports, timeout: float):
    """The group's rendezvous store. Rank 0 serves it on a port the system picks while it binds (no port chosen first
    and bound later, which another process could take in between) and hands the port to the other ranks."""
    from datetime import timedelta

    wait = timedelta(seconds=timeout)
    if rank == 0:
        store = torch.distributed.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=wait)
        for _ in range(world_size - 1):
            ports.put(store.port)
        return store
    import queue

    try:
        port = ports.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"rank 0 did not hand out the group's port within {timeout:g} s") from None
    return torch.distributed.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=wait)


def _group_worker(rank: int, world_size: int, ports, fn, args, results, timeout: float) -> None:
    """One forked process: join the gloo group, run ``fn(rank, world_size, *args)``, send its result home."""
    # A forked child must not use the OpenMP thread pool its parent started (GNU OpenMP is not fork-safe: the
    # first parallel region can hang when the parent has sampled before forking): one thread per rank.
    torch.set_num_threads(1)
    sent = False
    try:
        store = _group_store(rank, world_size, ports, timeout)
        torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        # gloo's connectFullMesh can return on one rank before the other's: a rank that ran ``fn`` and left at once
        # then fails the other's init ("Connection closed by peer"; 3 of 60 measured without this barrier, 0 of 100
        # with it), a rare failure of the exit and silent-rank tests. No rank runs ``fn`` before every rank has joined.
        torch.distributed.barrier()
        try:
            # JSON text: a tensor put on the queue as is would travel as a shared-memory handle that dies with
            # this process, and nothing is unpickled on the way home
            results.put((rank, json.dumps(_to_plain(fn(rank, world_size, *args))), None))
            sent = True
        finally:
            torch.distributed.destroy_process_group()
    except Exception as error:  # reported to the parent, which raises it
        if not sent:  # an error while leaving the group after the result went home does not undo the result
            results.put((rank, None, f"{type(error).__name__}: {error}"))


def run_cpu_group(fn, world_size: int = 2, *args, timeout: float = 60.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` real processes joined by a gloo process group
    on the CPU (``torch.distributed`` collectives work inside ``fn``); return the results in rank order.

    The processes are forked, so they inherit the caller's loaded models and imports and start in well
    under a second (accelerate launch would cost seconds per process); ``fn``'s results travel home as JSON
    (numbers, strings, lists, dicts, tensors). CPU only: a forked process cannot use an initialised CUDA context.
    A rank that exits without reporting is a ``RuntimeError`` at once (its exit code named), ranks still silent after
    ``timeout`` seconds a ``TimeoutError`` (a fork of a threaded kernel can hang: the message says so, and what to do);
    either way, and on an interrupt, the other ranks are terminated rather than waited for.
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    results, ports = context.Queue(), context.Queue()
    processes = [context.Process(target=_group_worker, args=(rank, world_size, ports, fn, args, results, timeout), daemon=True)
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    try:
        collected = sorted(_collect(results, processes, timeout), key=lambda item: item[0])
    except BaseException:  # a failed rank, a timeout, an interrupted cell: the others are not waited for
        for process in processes:
            if process.is_alive():
                process.terminate()
        raise
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
        for channel in (results, ports):
            channel.close()
    return [_from_plain(json.loads(value)) for _, value, _ in collected]


def _collect(results, processes, timeout: float) -> list:
    """Every rank's ``(rank, result, error)`` from ``results``, none with an error: a rank that reports one raises it
    with the others' reports (``_raise_errors``: they may be waiting for it in a collective, or fail in it), a rank
    that exits without reporting (killed, crashed, ``os._exit``) is an error at once, and ranks still silent after
    ``timeout`` seconds a ``TimeoutError`` — never a bare ``queue.Empty`` after the whole wait."""
    import queue
    import time

    collected: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout
    while len(collected) < len(processes):
        try:
            item = results.get(timeout=0.2)
            collected[item[0]] = item
            if item[2]:  # a rank's own error: the others may now wait in a collective for it, or fail in it
                _raise_errors(results, processes, collected)
            continue
        except queue.Empty:
            pass
        exited = {rank: p.exitcode for rank, p in enumerate(processes) if rank not in collected and p.exitcode is not None}
        if exited:  # its result may still be in the pipe (it was sent before the exit): one last look
            _drain(results, collected, wait=1.0)
            if any(item[2] for item in collected.values()):
                _raise_errors(results, processes, collected)
            exited = {rank: code for rank, code in exited.items() if rank not in collected}
            if exited:
                said = ", ".join(f"rank {rank} with exit code {code}" for rank, code in sorted(exited.items()))
                raise RuntimeError(f"a process of the CPU group exited before reporting its result: {said} "
                                   "(a negative code is the signal that ended it: -9 killed, e.g. by the kernel's "
                                   "out-of-memory killer; -11 a crash). Nothing was measured; run the call again.")
        if time.monotonic() > deadline:
            silent = [rank for rank in range(len(processes)) if rank not in collected]
            raise TimeoutError(
                f"the CPU group's rank(s) {silent} sent no result within timeout={timeout:g} s (reported: "
                f"{sorted(collected) or 'none'}). The processes are forked from this one: a fork of a process that runs "
                "threads (a notebook kernel does) can inherit a lock that no thread will release, and wait forever. "
                "Run the call again, restart the kernel before it, or pass a larger timeout= if the work is just slow.")
    return list(collected.values())


def _raise_errors(results, processes, collected: dict, grace: float = 2.0) -> None:
    """A rank reported an error: wait up to ``grace`` seconds for the others' reports (a rank that failed first makes
    the others fail in their collectives, and either report may arrive first), then raise them all, in rank order."""
    import queue
    import time

    deadline = time.monotonic() + grace
    while len(collected) < len(processes) and time.monotonic() < deadline:
        try:
            item = results.get(timeout=0.1)
            collected[item[0]] = item
            continue
        except queue.Empty:
            pass
        if all(p.exitcode is not None for rank, p in enumerate(processes) if rank not in collected):
            _drain(results, collected, wait=0.5)  # what they sent before exiting is still in the pipe
            break
    errors = [f"rank {rank}: {error}" for rank, _, error in sorted(collected.values(), key=lambda item: item[0]) if error]
    raise RuntimeError("a process of the CPU group failed: " + "; ".join(errors))


def _drain(results, collected: dict, wait: float) -> None:
    """Every report still in ``results`` into ``collected``, until none comes for ``wait`` seconds."""
    import queue

    try:
        while True:
            item = results.get(timeout=wait)
            collected[item[0]] = item
    except queue.Empty:
        pass
