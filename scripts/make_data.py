"""Write the tasks' JSONL files into data/ (run once; the results are committed).

    python scripts/make_data.py                # every task
    python scripts/make_data.py --task sums    # one task (arith: prompts and preference pairs; sums, restate: prompts)

Deterministic (fixed seeds): rerunning rewrites the same bytes.
"""

import argparse

from workbench.tasks import (
    TASKS,
    TEST_PREFERENCES,
    TEST_PROMPTS,
    TRAIN_PREFERENCES,
    TRAIN_PROMPTS,
    task_info,
    write_data_files,
    write_restate_files,
    write_sums_files,
)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=[*TASKS, "all"], default="all")
    args = parser.parse_args()
    written = []
    if args.task in ("arith", "all"):
        write_data_files()
        written += [TRAIN_PROMPTS, TEST_PROMPTS, TRAIN_PREFERENCES, TEST_PREFERENCES]
    if args.task in ("sums", "all"):
        write_sums_files()
        written += [task_info("sums").train_prompts, task_info("sums").test_prompts]
    if args.task in ("restate", "all"):
        write_restate_files()
        written += [task_info("restate").train_prompts, task_info("restate").test_prompts]
    for path in written:
        print(path, sum(1 for _ in open(path)))
