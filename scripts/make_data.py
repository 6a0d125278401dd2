"""Write the task's JSONL files into data/ (run once; the results are committed)."""

from workbench.tasks import TEST_PREFERENCES, TEST_PROMPTS, TRAIN_PREFERENCES, TRAIN_PROMPTS, write_data_files

if __name__ == "__main__":
    write_data_files()
    for path in (TRAIN_PROMPTS, TEST_PROMPTS, TRAIN_PREFERENCES, TEST_PREFERENCES):
        print(path, sum(1 for _ in open(path)))
