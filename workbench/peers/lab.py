"""The peer lab's plan and its one entry point: ``run_lab()`` runs every probe and returns the table.

Each ``Run`` names a result key, the environment (``envs.SPECS`` name, or ``"host"`` for the project's
own interpreter with TRL 1.16), the adapter module, its arguments, and the probes it is planned to
produce (so a peer that is skipped still has its rows in the table, marked skipped with the reason).
Runs execute as subprocesses, ``workers`` at a time (two on a 2-core machine).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core import progress
from workbench.core.paths import REPO_ROOT
from workbench.peers import envs
from workbench.peers import expectations as peer_lab
from workbench.peers import invoke as runner


@dataclass(frozen=True)
class Run:
    key: str
    env: str
    adapter: str
    peer: str
    version: str
    planned: tuple[tuple[str, str, str, str], ...]  # (probe, seed, role, expected)
    args: dict = field(default_factory=dict)


# What an adapter imports from the workbench beyond the protocol and the audit (part of its cache key).
ROLLOUT_CORRECTION_SOURCES = ("core/rollout_correction.py", "core/errors.py", "peers/adapters/rollout_correction_cases.py")
ADAPTER_SOURCES = {"trl_watch": ("peers/adapters/trl_eos.py", "watch"),
                   "verl_rollout_correction": ROLLOUT_CORRECTION_SOURCES,
                   "trl_rollout_correction": ROLLOUT_CORRECTION_SOURCES}
ROLLOUT_CORRECTION_CASES = ("heavy_tailed", "empty_rows", "one_token_rows", "inf", "nan_padding", "nan", "bf16")
TRL_POSITIONS = ("position_ids", "S1", "convention", "no position_ids in the GRPO log-prob forward")


def _host_version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def plan() -> list[Run]:
    trl_host = _host_version("trl")
    loss_types = ("grpo", "bnpo", "dr_grpo", "dapo")
    return [
        Run("trl-0.11.4", "trl-0.11.4", "trl_eos", "trl", "0.11.4",
            (("s3_eos_stopping", "S3", "bug", "rollout runs to response_length, not to EOS"),
             ("s3_eos_stopping_stop_token", "S3", "convention", 'stop_token="eos" truncates afterwards'))),
        Run("trl-1.16-eos", "host", "trl_eos", "trl", trl_host,
            (("s3_eos_stopping", "S3", "fix", "generation stops at EOS"),)),
        Run("trl-0.11.4-watch", "trl-0.11.4", "trl_watch", "trl", "0.11.4",
            (("s3_watch", "S3", "bug", "watch flags S3 with its wasted decoding forwards"),
             ("s3_watch_stop_token", "S3", "convention", 'stop_token="eos": watch still flags S3'))),
        Run("trl-1.16-watch", "host", "trl_watch", "trl", trl_host, (("s3_watch", "S3", "fix", "watch: no S3 finding"),)),
        Run("trl-0.15.2", "trl-0.15.2", "trl_grpo", "trl", "0.15.2",
            (("s5_zero_loss", "S5", "fix", "0 (per-sequence mean)"),
             ("aggregation", "S5", "convention", "seq-mean-token-mean"), TRL_POSITIONS)),
        Run("trl-0.16.1", "trl-0.16.1", "trl_grpo", "trl", "0.16.1",
            (("s5_zero_loss", "S5", "bug", "≠ 0 (global token mean)"), ("aggregation", "S5", "convention", "token-mean"),
             TRL_POSITIONS)),
        Run("trl-1.16", "host", "trl_grpo", "trl", trl_host,
            tuple((f"aggregation [{t}]", "S5", "convention", t) for t in loss_types) + (TRL_POSITIONS,),
            {"zero_loss_probe": False, "loss_types": list(loss_types)}),
        Run("transformers-4.41.2", "transformers-4.41.2", "transformers_qwen2", "transformers", "4.41.2",
            (("s2_flash_right_padding", "S2", "bug", "right padding → ValueError"),
             ("s2_flash_left_padding", "S2", "convention", "left padding accepted"))),
        Run("transformers-4.42.4", "transformers-4.42.4", "transformers_qwen2", "transformers", "4.42.4",
            (("s2_flash_right_padding", "S2", "fix", "right padding accepted"),
             ("s2_flash_left_padding", "S2", "convention", "left padding accepted"))),
        Run("openrlhf-0.11.2", "openrlhf-0.11.2", "openrlhf", "openrlhf", "0.11.2",
            (("dpo_mask", "S4", "fix", "prompt tokens masked on both halves"),
             ("position_ids", "S1", "fix", "position ids from the mask"),
             ("temperature", "P6", "convention", "log-probs at τ"), ("aggregation", "S5", "convention", "token-mean / seq-mean"),
             ("kl_estimators", "P9", "convention", "clamped to ±10"), ("entropy_temperature", "P15", "convention", "after τ"))),
        Run("verl-0.9.1", "verl-0.9.1", "verl", "verl", "0.9.1",
            (("aggregation", "S5", "convention", "agg_loss modes"),
             ("grpo_advantage", "S5", "convention", "Bessel std, ε = 1e-6"),
             ("kl_penalty", "P9", "convention", "low_var_kl clamped"), ("dual_clip", "PPO", "convention", "c = 3"))),
        Run("verl-0.9.1-rollout-correction", "verl-0.9.1", "verl_rollout_correction", "verl", "0.9.1",
            tuple((f"rollout_correction [{case}]", "P12", "convention", "workbench = verl within 1e-5")
                  for case in ROLLOUT_CORRECTION_CASES)),
        Run("trl-1.16-rollout-correction", "host", "trl_rollout_correction", "trl", trl_host,
            tuple((f"trl_rollout_correction [{case}]", "P12", "convention", "workbench = TRL within 1e-5")
                  for case in ROLLOUT_CORRECTION_CASES if case not in ("nan_padding", "bf16"))),
    ]


def rows_of(run: Run, payload: dict) -> list[dict]:
    """Table rows of one run: judged measurements, or the planned probes marked skipped/error."""
    if payload.get("status") != "ok" or not payload.get("rows"):
        reason = payload.get("reason") or "no rows returned"
        return peer_lab.placeholder_rows(run.peer, run.version, list(run.planned), payload.get("status", "error"), reason)
    version = run.version
    if run.env == runner.HOST:
        version = payload.get("environment", {}).get(run.peer) or version
    rows = [peer_lab.judge(run.peer, version, r) for r in payload["rows"]]
    standins = payload.get("environment", {}).get("standins") or {}
    if standins:
        for row in rows:
            row["standins"] = sorted(standins)
    return rows


def cache_key(run: Run, root=None) -> str | None:
    """A digest of everything a run's result depends on: the environment's exact pins and freeze (or the
    host's python and TRL), the adapter, protocol and audit source, and the arguments. None: no environment."""
    if run.env == runner.HOST:
        env_part = f"{sys.version}|trl {_host_version('trl')}|transformers {_host_version('transformers')}"
    else:
        stamp = envs.read_stamp(envs.env_dir(envs.get_spec(run.env), root))
        if stamp is None:
            return None
        env_part = json.dumps(stamp.get("pins"), sort_keys=True) + json.dumps(stamp.get("freeze"))
    digest = hashlib.sha256(env_part.encode())
    peers = REPO_ROOT / "workbench" / "peers"
    code = [peers / "adapters" / f"{run.adapter}.py", peers / "protocol.py", *sorted(envs.STANDINS.rglob("*.py")),
            *sorted((REPO_ROOT / "workbench" / "audit").rglob("*.py"))]
    for source in ADAPTER_SOURCES.get(run.adapter, ()):
        path = REPO_ROOT / "workbench" / source
        code += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for path in code:
        digest.update(path.read_bytes())
    digest.update(json.dumps([run.adapter, run.args], sort_keys=True).encode())
    return digest.hexdigest()[:20]


def cache_path(run: Run, root=None) -> Path:
    return envs.peers_root(root) / "results" / f"{run.key}.json"


def cached(run: Run, root=None) -> dict | None:
    """The stored payload of ``run`` if it was measured with the same environment, code and arguments."""
    key = cache_key(run, root)
    try:
        stored = json.loads(cache_path(run, root).read_text())
    except (OSError, ValueError):
        return None
    return stored["payload"] if key is not None and stored.get("key") == key else None


def store(run: Run, payload: dict, root=None) -> None:
    key = cache_key(run, root)
    if key is None or payload.get("status") != "ok":
        return
    path = cache_path(run, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "payload": payload}))
    tmp.replace(path)


def run_lab(workers: int = 2, only: list[str] | None = None, root=None, timeout: float = 600,
            reuse: bool = False) -> tuple[list[dict], dict]:
    """Run the plan (or the runs named in ``only``); returns (table rows, payloads by run key).

    ``reuse``: take a run's stored result when its environment, the adapter/audit code and the arguments
    are unchanged (``make peers`` stores them); otherwise every adapter runs now. Results are stored."""
    runs = [r for r in plan() if only is None or r.key in only]

    def one(run: Run) -> dict:
        payload = cached(run, root) if reuse else None
        if payload is not None:
            return {**payload, "reused": True}
        payload = runner.run(run.env, run.adapter, run.args, timeout=timeout, root=root)
        store(run, payload, root)
        return payload

    # a bar over the runs: a stored result counts at once, a run in its environment takes about a minute
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, progress.bar(len(runs), "peer runs", unit="run") as bar:
        futures = {run.key: pool.submit(one, run) for run in runs}
        for future in as_completed(futures.values()):
            future.result()
            bar.update(1)
    payloads = {key: future.result() for key, future in futures.items()}
    rows = [row for run in runs for row in rows_of(run, payloads[run.key])]
    return rows, payloads


def summary_lines(rows: list[dict], payloads: dict) -> list[str]:
    """One line per run (status, seconds, stand-ins) and the verdict counts: what ``make peers`` prints."""
    lines = []
    for key, p in payloads.items():
        standins = ", ".join(sorted((p.get("environment") or {}).get("standins") or {})) or "none"
        timing = "stored " if p.get("reused") else f"{p.get('seconds', 0):5.1f} s"
        lines.append(f"[peers] {key:22s} {p.get('status', '?'):8s} {timing}  stand-ins: {standins}"
                     + (f"  ({p.get('reason', '')[:160]})" if p.get("status") != "ok" else ""))
    reproduced, fixed = peer_lab.verdict(rows)
    lines.append(f"[peers] rows: {peer_lab.counts(rows)}; buggy releases show the bugs: {reproduced}; "
                 f"fixed releases clean: {fixed}")
    return lines


def main(argv=None) -> int:
    """``python -m workbench.peers.lab``: create missing environments (soft-failing), run every probe,
    print the table. Exit 0 even when peers are skipped (they are reported, not failures)."""

    args = list(argv if argv is not None else sys.argv[1:])
    if "--no-create" not in args:
        for spec in envs.SPECS.values():
            envs.create(spec)
    rows, payloads = run_lab()
    print("\n".join("[peers] " + line for line in peer_lab.table(rows, fmt="text").splitlines()))
    print("\n".join(summary_lines(rows, payloads)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
