"""``trainers.fsdp_sharding`` in 2 real forked CPU processes (gloo): an AdamW step of a model sharded with FSDP2 gives,
once gathered (``full_state``), the weights and the optimiser state (by parameter index, the one-process checkpoint
format) of the same step in one process; ``loaders`` put a full state back into fresh shards, which gather to it again.
Two forked processes with FSDP2's collectives: ~10 s of CPU, slow."""

from __future__ import annotations

import copy

import pytest
import torch

from workbench.modeling.tiny import tiny_model
from workbench.trainers import fsdp_sharding
from workbench.trainers.distributed import run_cpu_group


def _stepped(model, optimizer, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _max_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _shard_step_gather_reload(rank: int, world_size: int) -> dict:
    model, _ = tiny_model("llama", seed=3)
    model.train()
    plain = copy.deepcopy(model)
    ids = torch.tensor([[1, 5, 9, 4, 2, 7], [3, 8, 6, 1, 5, 2]])
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    _stepped(plain, plain_optimizer, ids)  # the one-process step

    sharded, optimizer = fsdp_sharding.shard(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    _stepped(sharded, optimizer, ids)  # every rank the same rows: the averaged gradient is the one-process gradient
    owners = {"optimizer": sharded}
    modules, optimizers = fsdp_sharding.full_state({"policy": sharded}, {"optimizer": optimizer}, owners)
    weights, state = modules["policy"].state_dict(), optimizers["optimizer"].state_dict()
    result = {"rank": rank, "weights": len(weights)}
    if rank == 0:
        expected = plain_optimizer.state_dict()
        result["weight_gap"] = _max_gap(weights, plain.state_dict())
        result["moment_gap"] = max(_max_gap({"m": s["exp_avg"], "v": s["exp_avg_sq"]},
                                            {"m": expected["state"][i]["exp_avg"], "v": expected["state"][i]["exp_avg_sq"]})
                                   for i, s in state["state"].items())
        result["indices"] = sorted(state["state"]) == sorted(expected["state"])
    # back into fresh shards: every process loads the full state (rank 0's, broadcast as the files would give it)
    payload = [weights, state]
    torch.distributed.broadcast_object_list(payload, src=0)
    fresh, _ = tiny_model("llama", seed=4)
    fresh, fresh_optimizer = fsdp_sharding.shard(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2))
    model_loaders, optimizer_loaders = fsdp_sharding.loaders({"policy": fresh}, {"optimizer": fresh_optimizer}, {"optimizer": fresh})
    model_loaders["policy"].load_state_dict(copy.deepcopy(payload[0]))  # (torch's loader replaces the dict's tensors)
    optimizer_loaders["optimizer"].load_state_dict(copy.deepcopy(payload[1]))
    again, _ = fsdp_sharding.full_state({"policy": fresh}, {}, {})
    if rank == 0:
        result["reload_gap"] = _max_gap(again["policy"].state_dict(), payload[0])
    return result


@pytest.mark.slow
def test_sharded_step_gathers_to_the_one_process_step_and_reloads():
    ranks = run_cpu_group(_shard_step_gather_reload, 2, timeout=120.0)
    first = ranks[0]
    assert first["weights"] > 0 and ranks[1]["weights"] == 0  # the full state on rank 0 only
    assert first["indices"]  # the optimiser state keyed by parameter index, as one process writes it
    assert first["weight_gap"] < 1e-6 and first["moment_gap"] < 1e-6, first
    assert first["reload_gap"] == 0.0
