"""``trainers.distributed.run_cpu_group``: real forked CPU processes joined by gloo — their results come home in rank
order, and a rank that dies or stays silent is a clear error at once or at the timeout, never a bare ``queue.Empty``;
the rendezvous port is taken by the rank that serves it, never chosen beforehand (another process could take it)."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch

from workbench.trainers.distributed import run_cpu_group


def _all_reduced(rank: int, world_size: int) -> dict:
    value = torch.tensor([rank + 1.0])
    torch.distributed.all_reduce(value)
    return {"rank": rank, "world_size": world_size, "sum": value}


def _exits_on_rank_1(rank: int, world_size: int) -> int:
    if rank == 1:
        os._exit(3)  # dies without reporting, as a killed or crashed process would
    return rank


def _silent_on_rank_1(rank: int, world_size: int) -> int:
    if rank == 1:
        time.sleep(60)
    return rank


def _rank_1_reports_a_second_later(rank: int, world_size: int) -> int:
    if rank == 1:
        time.sleep(1.0)
    return rank


def _fails_on_rank_0_while_rank_1_waits_for_it(rank: int, world_size: int) -> float:
    if rank == 0:
        raise ValueError("a deterministic bug")
    value = torch.tensor([1.0])
    torch.distributed.all_reduce(value)  # waits for rank 0, which never comes
    return float(value)


def test_results_come_home_in_rank_order_with_their_tensors():
    results = run_cpu_group(_all_reduced, 2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    assert all(torch.equal(r["sum"], torch.tensor([3.0])) for r in results)  # 1 + 2, summed over the group


def test_a_rank_that_exits_without_reporting_is_an_error_at_once():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 with exit code 3"):
        run_cpu_group(_exits_on_rank_1, 2, timeout=60)
    assert time.monotonic() - start < 30  # not the whole timeout


def test_a_silent_rank_is_a_timeout_error_that_names_it_and_the_fix():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] sent no result within timeout=10 s \(reported: \[0\]\).*timeout="):
        run_cpu_group(_silent_on_rank_1, 2, timeout=10)
    assert time.monotonic() - start < 40  # the silent rank is terminated, not waited for


def test_a_rank_s_own_error_is_raised_at_once_not_the_wait_it_causes():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0: ValueError: a deterministic bug"):
        run_cpu_group(_fails_on_rank_0_while_rank_1_waits_for_it, 2, timeout=60)
    assert time.monotonic() - start < 30


def test_the_calling_process_picks_no_port_for_the_group(monkeypatch):
    """A port chosen by binding and releasing a socket, then bound again by a rank, can be taken in between by any
    other process (two xdist workers running groups at once): the group's rank 0 serves its store on a port the
    system gives it while it binds. The calling process binds no socket at all (its forks inherit this patch, but the
    ranks' store and gloo bind in C++)."""

    def refuse(self, address):
        raise AssertionError(f"the calling process bound a socket to {address}")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    results = run_cpu_group(_all_reduced, 2)
    assert [float(r["sum"]) for r in results] == [3.0, 3.0]


def test_an_error_while_leaving_the_group_after_the_result_went_home_is_not_the_ranks_error(monkeypatch):
    """A rank reports once: a teardown error after its result was sent (the group's plumbing, not ``fn``) must not
    follow the result as a second report of the same rank, overwrite it and turn a finished run into a failure."""
    leave = torch.distributed.destroy_process_group

    def leave_then_fail(*args, **kwargs):
        leave(*args, **kwargs)
        raise RuntimeError("a teardown error")

    monkeypatch.setattr(torch.distributed, "destroy_process_group", leave_then_fail)  # the forked ranks inherit it
    assert run_cpu_group(_rank_1_reports_a_second_later, 2) == [0, 1]  # rank 0's teardown error comes first
