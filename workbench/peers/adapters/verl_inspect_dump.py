"""verl 0.9.1's rollout dumps and ``rollout_corr/`` metrics, made by verl's own code, for ``workbench.inspect``'s tests.

Three rows:

* ``rollout_data_dir`` — the JSONL files of ``trainer.rollout_data_dir``, written by verl's ``_write_generations``
  of both trainers (``verl.trainer.ppo.ray_trainer.RayPPOTrainer``, steps 1–2, and
  ``verl.trainer.ppo.v1.trainer_base``, step 3). Those modules import the whole trainer stack (``torchdata``,
  ``transfer_queue``, ray), which the peer environment does not carry, so the static method's source is taken
  from verl's installed file (``ast``) and run on its own with the names it uses (``json``, ``os``, ``numpy``).
* ``dataproto`` — a ``DataProto`` pickled by verl's ``save_to_disk`` (which the inspector refuses), and the same batch
  exported to the generic format by ``workbench.inspect.export.verl_batch_records`` after verl's ``load_from_disk``;
* ``rollout_corr`` — verl's ``compute_rollout_corr_metrics_from_logprobs`` on each step of a generic dump (args
  ``generic``: a JSONL path), the responses right-padded into (batch, length) float64 tensors.
"""

from __future__ import annotations

import ast
import json
import os
from collections import defaultdict

import numpy as np
import torch

from workbench.peers import protocol


def import_peer():
    from verl.trainer.ppo import rollout_corr_helper  # noqa: F401


def verl_write_generations(module: str, class_name: str):
    """verl's ``<class_name>._write_generations`` compiled from the installed source of ``module``."""
    import importlib.util

    package = importlib.util.find_spec("verl").submodule_search_locations[0]  # not the module's: its package imports it
    path = os.path.join(package, *module.split(".")[1:]) + ".py"
    source = open(path, encoding="utf-8").read()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "_write_generations":
                    item.decorator_list = []
                    namespace = {"json": json, "os": os, "np": np}
                    exec(compile(ast.Module(body=[item], type_ignores=[]), path, "exec"), namespace)
                    return namespace["_write_generations"], path
    raise LookupError(f"no {class_name}._write_generations in {path}")


def write_rollout_data_dir(folder: str) -> dict:
    writers = {"ray_trainer": verl_write_generations("verl.trainer.ppo.ray_trainer", "RayPPOTrainer"),
               "v1": verl_write_generations("verl.trainer.ppo.v1.trainer_base", "PPOTrainer")}
    written = {}
    for step, trainer in ((1, "ray_trainer"), (2, "ray_trainer"), (3, "v1")):
        write, path = writers[trainer]
        inputs = [f"What is {g} + {g}?" for g in range(4) for _ in range(4)]
        outputs = [f"{2 * g if i % 2 else 2 * g + 1}" for g in range(4) for i in range(4)]
        scores = [1.0 if i % 2 else 0.0 for g in range(4) for i in range(4)]
        extras = {"acc": np.asarray(scores)}
        if trainer == "v1":  # the v1 trainer dumps the uid "{sample}_{rollout}_{output}"
            extras["uid"] = [f"s{g}_0_{i}" for g in range(4) for i in range(4)]
        write(inputs, outputs, [str(2 * g) for g in range(4) for _ in range(4)], scores, extras, folder, step)
        written[str(step)] = {"trainer": trainer, "source": os.path.basename(path)}
    return {"folder": folder, "files": sorted(os.listdir(folder)), "written": written}


def rollout_corr_by_step(generic: str) -> dict:
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs

    steps = defaultdict(list)
    with open(generic, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            steps[record["step"]].append(record)
    out = {}
    for step, rows in sorted(steps.items()):
        width = max(len(row["response_ids"]) for row in rows)
        log_prob, rollout, mask = (torch.zeros(len(rows), width, dtype=torch.float64) for _ in range(3))
        for i, row in enumerate(rows):
            n = len(row["response_ids"])
            log_prob[i, :n] = torch.tensor(row["trainer_logprobs"], dtype=torch.float64)
            rollout[i, :n] = torch.tensor(row["rollout_logprobs"], dtype=torch.float64)
            mask[i, :n] = torch.tensor(row.get("loss_mask", [1] * n)[-n:], dtype=torch.float64)
        out[str(step)] = {k: float(v) for k, v in compute_rollout_corr_metrics_from_logprobs(log_prob, rollout, mask).items()}
    return out


def dataproto_dump(folder: str) -> dict:
    """A verl ``DataProto`` in verl's layout (8 rows, 2 groups, left-padded prompts, right-padded responses ending
    with EOS 2 whose ``response_mask`` is 0: the pad = EOS signature), pickled by ``save_to_disk``, then loaded back
    (the user's own pickle, in verl's environment) and exported with ``workbench.inspect.export``."""
    from verl import DataProto

    from workbench.inspect.export import verl_batch_records, write_jsonl

    generator = torch.Generator().manual_seed(0)
    rows, prompt_width, response_width = 8, 5, 6
    prompts = torch.randint(3, 100, (rows, prompt_width), generator=generator)
    prompts[:4, :2] = 0  # left padding
    responses = torch.randint(3, 100, (rows, response_width), generator=generator)
    lengths = [3, 4, 5, 6, 6, 2, 4, 5]
    attention = torch.ones(rows, prompt_width + response_width, dtype=torch.long)
    attention[:4, :2] = 0
    response_mask = torch.zeros(rows, response_width)
    for row, length in enumerate(lengths):
        responses[row, length - 1] = 2
        responses[row, length:] = 0
        attention[row, prompt_width + length:] = 0
        response_mask[row, : length - 1] = 1
    rollout = -torch.rand(rows, response_width, generator=generator, dtype=torch.float64)
    scores = torch.zeros(rows, response_width)
    scores[torch.arange(rows), torch.tensor(lengths) - 1] = torch.tensor([0.0, 1.0, 0.5, 1.0, 0.0, 1.0, 0.25, 0.75])
    batch = DataProto.from_dict(tensors={"prompts": prompts, "responses": responses, "attention_mask": attention,
                                         "response_mask": response_mask, "rollout_log_probs": rollout,
                                         "old_log_probs": rollout + 0.001, "token_level_scores": scores},
                                non_tensors={"uid": np.array(["g0"] * 4 + ["g1"] * 4, dtype=object)},
                                meta_info={"temperature": 1.0})
    os.makedirs(folder, exist_ok=True)
    pickled = os.path.join(folder, "batch.pkl")
    batch.save_to_disk(pickled)
    records = verl_batch_records(DataProto.load_from_disk(pickled), step=7, eos_token_id=2)
    generic = write_jsonl(records, os.path.join(folder, "batch.jsonl"))
    return {"pickled": pickled, "generic": generic, "lengths": lengths,
            "prompt_lengths": [len(record["prompt_ids"]) for record in records]}


def probes(args) -> list[dict]:
    rows = [{"probe": "rollout_data_dir", "measured": write_rollout_data_dir(args["folder"]), "audit": None},
            {"probe": "dataproto", "measured": dataproto_dump(args["folder"] + "-dataproto"), "audit": None}]
    if args.get("generic"):
        rows.append({"probe": "rollout_corr", "measured": rollout_corr_by_step(args["generic"]), "audit": None})
    return rows


if __name__ == "__main__":
    protocol.run_adapter(import_peer, probes, ["verl", "torch"])
