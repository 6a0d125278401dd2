"""``workbench.inspect``'s speed and memory on a generic dump, against a plain pandas read of the same file.

    python benchmarks/inspect_speed.py                  # 1 M response tokens (JSONL and Parquet) and 0.1 M for the 10× ratio
    python benchmarks/inspect_speed.py --tokens 10000000 --small 1000000   # the 10× ratio one size up

Writes a clean synthetic dump (``workbench.inspect.synthetic``, responses of 1–512 tokens, every field of the generic
format) of about ``--tokens`` response tokens as JSONL and Parquet, and one of ``--small`` tokens as JSONL. Each
measurement runs in a fresh process (one torch thread): wall and CPU seconds of the call, and its peak memory above
the process's memory after its imports (Linux: the peak resident size, reset by ``/proc/self/clear_refs`` before the
call, minus the resident size then). Printed:

* ``inspect JSONL`` / ``inspect Parquet`` — ``workbench.inspect(path)``: response tokens per second, peak memory;
* ``pandas.read_json(lines=True)`` / ``pandas.read_parquet`` — the same file read into a DataFrame, nothing checked;
* ``scaling`` — the CPU time of the large JSONL ÷ the small one's, against the size ratio (target: ≤ 1.1 × the ratio).

Rates are per CPU-second of the measuring process, which other processes on shared cores cannot slow down (the wall
seconds are printed beside them), as in ``benchmarks/run.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_dump(folder: str, tokens: int, seed: int) -> tuple[str, str, int]:
    """A clean dump of at least ``tokens`` response tokens, as JSONL and Parquet; returns (jsonl, parquet, tokens)."""
    from workbench.inspect import export, synthetic

    written, step = 0, 0
    jsonl = os.path.join(folder, f"dump-{tokens}.jsonl")
    parquet = os.path.join(folder, f"dump-{tokens}.parquet")

    def rows():
        nonlocal written, step
        while written < tokens:
            for row in synthetic.records(None, steps=1, groups=4, group_size=8, max_length=512, seed=seed + step):
                row["step"] = row["policy_version"] = step
                row["group"] = f"{step}-{row['group']}"
                written += len(row["response_ids"])
                yield row
            step += 1

    export.write_jsonl(rows(), jsonl)
    total, written, step = written, 0, 0
    synthetic.write_parquet(rows(), parquet)
    return jsonl, parquet, total


def _status(field: str) -> int:
    """A memory figure of /proc/self/status (VmRSS: resident now, VmHWM: its peak), in bytes."""
    with open("/proc/self/status") as handle:
        return next(int(row.split()[1]) * 1024 for row in handle if row.startswith(field + ":"))


def measure(kind: str, path: str) -> dict:
    """Run one measurement in this process; returns seconds, CPU seconds and peak bytes above the start."""
    if kind == "inspect":
        from workbench.inspect import inspect

        call = lambda: inspect(path, show_progress=False).observed["response_tokens"]  # noqa: E731
    else:
        import pandas

        call = (lambda: len(pandas.read_json(path, lines=True))) if path.endswith(".jsonl") else (  # noqa: E731
            lambda: len(pandas.read_parquet(path)))
    if path.endswith(".parquet"):  # pyarrow's import and its memory pool's first allocations are not the read's
        import pyarrow.parquet

        pyarrow.parquet.ParquetFile(path).read_row_group(0)

    with open("/proc/self/clear_refs", "w") as handle:  # "5": reset the peak resident size to the current one
        handle.write("5")
    start_memory = _status("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    result = call()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = _status("VmHWM") - start_memory
    return {"seconds": wall, "cpu_seconds": cpu, "peak_bytes": max(peak, 0), "result": result}


def run(kind: str, path: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, WORKBENCH_PROGRESS="0")
    out = subprocess.run([sys.executable, __file__, "--measure", kind, path], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def line(name: str, tokens: int, measured: dict) -> str:
    return (f"{name:<30} {tokens / measured['cpu_seconds'] / 1e6:6.2f} M tokens/CPU-s  {measured['cpu_seconds']:6.2f} CPU s "
            f"({measured['seconds']:.2f} s wall)  peak {measured['peak_bytes'] / 2**20:7.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000, help="response tokens of the large dump")
    parser.add_argument("--small", type=int, default=100_000, help="response tokens of the small dump (the 10× ratio)")
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    sys.path.insert(0, ROOT)
    with tempfile.TemporaryDirectory(prefix="inspect-speed-") as folder:
        jsonl, parquet, tokens = write_dump(folder, args.tokens, seed=0)
        small, _, small_tokens = write_dump(folder, args.small, seed=1)
        print(f"dump: {tokens:,} response tokens, JSONL {os.path.getsize(jsonl) / 2**20:.0f} MiB, "
              f"Parquet {os.path.getsize(parquet) / 2**20:.0f} MiB; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        large = run("inspect", jsonl)
        print(line("inspect JSONL", tokens, large))
        print(line("pandas.read_json(lines=True)", tokens, run("pandas", jsonl)))
        print(line("inspect Parquet", tokens, run("inspect", parquet)))
        print(line("pandas.read_parquet", tokens, run("pandas", parquet)))
        little = run("inspect", small)
        print(line("inspect JSONL (small)", small_tokens, little))
        size, cost = tokens / small_tokens, large["cpu_seconds"] / little["cpu_seconds"]
        print(f"scaling: {size:.1f}× the tokens cost {cost:.2f}× the CPU time (wall {large['seconds'] / little['seconds']:.2f}×; "
              f"target ≤ {1.1 * size:.1f}×)")


if __name__ == "__main__":
    main()
