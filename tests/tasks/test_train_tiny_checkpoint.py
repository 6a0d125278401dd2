"""scripts/train_tiny_checkpoint.py: a smoke run on the sums task (seconds), and the shipped sums checkpoint."""

import importlib.util
import json

import pytest
from transformers import AutoModelForCausalLM

from workbench import tasks
from workbench.core.paths import REPO_ROOT
from workbench.experiments.checkpoints import load
from workbench.experiments.evaluation import greedy_results, response_results

SCRIPT = REPO_ROOT / "scripts" / "train_tiny_checkpoint.py"
spec = importlib.util.spec_from_file_location("train_tiny_checkpoint", SCRIPT)
train_tiny_checkpoint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_tiny_checkpoint)


def test_smoke_run_writes_a_loadable_checkpoint_and_its_card(tmp_path):
    out = tmp_path / "tiny-sums"
    card = train_tiny_checkpoint.main(["--task", "sums", "--steps", "3", "--max-seconds", "20", "--eval-problems", "8",
                                       "--batch-size", "8", "--out", str(out)])
    assert card["task"] == "sums" and 1 <= card["sft_steps"] <= 3 and card["eval_problems"] == 8
    assert card["max_new_tokens"] == 48
    assert json.loads((out / "training.json").read_text())["sft_steps"] == card["sft_steps"]
    readme = (out / "README.md").read_text()
    assert "held-out greedy accuracy" in readme and "generated (all)" in readme and "--task sums" in readme
    lengths = card["lengths"]
    assert lengths["generated (all)"]["n"] == 8 and 1 <= lengths["generated (all)"]["min"] <= lengths["generated (all)"]["max"] <= 48
    assert 8 <= lengths["correct (reference)"]["min"] <= lengths["correct (reference)"]["max"] <= 37
    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "qwen2"


def test_unknown_task_or_missing_defaults_exit_with_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        train_tiny_checkpoint.main(["--task", "sum"])
    assert exc.value.code == 2 and "invalid choice: 'sum'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        train_tiny_checkpoint.main(["--task", "sums", "--arch", "gpt2"])
    assert exc.value.code == 2 and "pass --steps and --lr" in capsys.readouterr().err


@pytest.fixture(scope="module")
def shipped():
    folder = tasks.task_info("sums").checkpoint_folder
    return folder, json.loads((folder / "training.json").read_text())


def test_shipped_sums_checkpoint_card_states_size_accuracy_and_lengths(shipped):
    folder, card = shipped
    assert (folder / "model.safetensors").exists() and not list(folder.glob("*.bin"))
    assert card["task"] == "sums" and card["parameters"] < 3_000_000
    assert 0.30 <= card["greedy_test_accuracy"] <= 0.60
    generated = card["lengths"]["generated (all)"]
    assert generated["max"] - generated["min"] >= 15  # a spread of response lengths
    readme = (folder / "README.md").read_text()
    assert f"{card['greedy_test_accuracy']:.3f}" in readme and card["command"] in readme


def test_shipped_sums_checkpoint_is_right_part_of_the_time_on_held_out_prompts(shipped):
    folder, card = shipped
    model, tokenizer = load("tiny-sums-qwen2")
    assert AutoModelForCausalLM.from_pretrained(folder).num_parameters() == card["parameters"]
    test = tasks.load_problems(tasks.task_info("sums").test_prompts)[:128]
    rewards, lengths = greedy_results(model, tokenizer, test)
    accuracy = float(rewards.mean())
    assert 0.25 <= accuracy <= 0.65, accuracy
    assert int(lengths.max()) - int(lengths.min()) >= 10


def test_the_cards_tokenizer_instruction_gives_the_workbench_ids(shipped):
    """The card says how to open the tokenizer outside the workbench (``PreTrainedTokenizerFast``): on the task's prompts
    it gives the ids ``workbench.load`` gives. (``AutoTokenizer`` picks ``Qwen2Tokenizer`` for this config in
    transformers 5.23 and loses the spaces of the sums prompts.)"""
    from transformers import PreTrainedTokenizerFast

    folder, _ = shipped
    assert "PreTrainedTokenizerFast.from_pretrained(folder)" in (folder / "README.md").read_text()
    assert train_tiny_checkpoint.TOKENIZER_NOTE in (folder / "README.md").read_text()
    _, workbench_tokenizer = load("tiny-sums-qwen2")
    plain = PreTrainedTokenizerFast.from_pretrained(str(folder))
    prompts = [p.prompt for p in tasks.load_problems(tasks.task_info("sums").test_prompts)[:64]]
    assert [plain(p)["input_ids"] for p in prompts] == [workbench_tokenizer(p)["input_ids"] for p in prompts]


def test_shipped_restate_checkpoint_is_right_part_of_the_time_and_sometimes_goes_on():
    """``tiny-restate-qwen2``: greedy accuracy in the card's 30-60 % band, and sampled at temperature 1 (as RL samples)
    it restates its first answer a varying number of times — the room pitfall P11 needs (docs/journal/2026-11-26.md, 22:34, regime E)."""
    import torch

    from workbench.tasks import restate

    info = tasks.task_info("restate")
    card = json.loads((info.checkpoint_folder / "training.json").read_text())
    assert card["task"] == "restate" and card["parameters"] < 3_000_000 and 0.30 <= card["greedy_test_accuracy"] <= 0.60
    assert "sampled at temperature 1" in card["lengths"] and f"{card['sampled_reward']:.3f}" in (
        info.checkpoint_folder / "README.md").read_text()
    model, tokenizer = load("tiny-restate-qwen2")
    test = tasks.load_problems(info.test_prompts)[:128]
    rewards, _ = greedy_results(model, tokenizer, test)
    assert 0.25 <= float(rewards.mean()) <= 0.65
    _, _, finished = response_results(model, tokenizer, test, greedy=False, generator=torch.Generator().manual_seed(0))
    assert float(finished.float().mean()) > 0.95  # at its own budget it stops
    ids, mask = tasks.encode_prompts(tokenizer, [p.prompt for p in test])
    from workbench.modeling.rollout import sample

    r = sample(model, ids, mask, max_new_tokens=info.max_new_tokens, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
    counts = [restate.restatement_count(t) for t in tasks.decode_responses(tokenizer, r.response_ids, r.response_mask)]
    assert {0, 1, 2} <= set(counts)  # stops at once, restates once, restates twice or more


def test_the_default_output_is_the_task_and_architecture_folder_never_another_checkpoint():
    from workbench.core.paths import DATA_DIR

    assert train_tiny_checkpoint.output_folder("arith", "qwen2") == tasks.task_info("arith").checkpoint_folder
    assert train_tiny_checkpoint.output_folder("restate", "qwen2") == tasks.task_info("restate").checkpoint_folder
    assert train_tiny_checkpoint.output_folder("arith", "llama") == DATA_DIR / "checkpoints" / "tiny-arith-llama"
    assert train_tiny_checkpoint.output_folder("restate", "gpt2") == DATA_DIR / "checkpoints" / "tiny-restate-gpt2"
