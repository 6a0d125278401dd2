import json

from workbench import tasks
from workbench.experiments.evaluation import greedy_accuracy
from workbench.modeling.tokenizer import build_char_tokenizer


def test_shipped_tokenizer_has_distinct_specials_and_is_reproducible(tokenizer):
    assert len(tokenizer) == 64
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    assert len(ids) == 3
    assert build_char_tokenizer().get_vocab() == tokenizer.get_vocab()


def test_one_character_one_token(tokenizer):
    encoded = tokenizer("47+8=")["input_ids"]
    assert encoded[0] == tokenizer.bos_token_id and len(encoded) == 6
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "47+8="


def test_reward_needs_the_exact_answer_and_eos():
    problem = tasks.Problem("47+8=", "55")
    assert tasks.reward("55", True, problem) == 1.0
    assert tasks.reward("55", False, problem) == 0.0
    assert tasks.reward("56", True, problem) == 0.0


def test_data_files_are_disjoint_and_have_a_spread_of_lengths():
    train = {p.prompt for p in tasks.load_problems(tasks.TRAIN_PROMPTS)}
    test = tasks.load_problems(tasks.TEST_PROMPTS)
    assert not train & {p.prompt for p in test}
    assert {len(p.answer) for p in test} >= {1, 2, 3}
    assert len({len(p.prompt) for p in test}) >= 3
    pairs = tasks.load_preferences(tasks.TEST_PREFERENCES)
    assert all(p["chosen"] != p["rejected"] for p in pairs)
    assert any(len(p["chosen"]) != len(p["rejected"]) for p in pairs)


def test_shipped_checkpoint_is_right_only_part_of_the_time(tokenizer):
    from workbench.experiments.checkpoints import load
    from workbench.modeling.tiny import TRAINED_CHECKPOINTS

    for name, folder in TRAINED_CHECKPOINTS.items():
        card = json.loads((folder / "training.json").read_text())
        model, tok = load(name)
        test = tasks.load_problems(tasks.task_info(card.get("task", "arith")).test_prompts)[:400]  # the card's task
        accuracy = greedy_accuracy(model, tok, test)
        assert 0.1 < accuracy < 0.8, (name, accuracy)
        assert abs(accuracy - card["greedy_test_accuracy"]) < 0.1
