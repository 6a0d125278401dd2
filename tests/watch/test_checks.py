"""The row-layout checks of one forward (S1, P21, P8, and S2 on a cached generation that continues right-padded
prompts) called on a tiny GPT-2 directly; how a finding keeps the most severe message and sums its counts; and the
pure measurements of ``workbench.watch.observe`` the checks decide on."""

from pathlib import Path

import torch

from workbench import watch
from workbench.modeling.tiny import tiny_model
from workbench.watch import observe
from workbench.watch.watcher import Watch


def gpt2_with_pad_as_eos():
    model, tokenizer = tiny_model("gpt2", seed=1)
    tokenizer.pad_token_id = tokenizer.eos_token_id
    return model, tokenizer


def test_one_training_forward_shows_left_padding_duplicate_bos_and_a_masked_eos_in_check_order():
    model, tokenizer = gpt2_with_pad_as_eos()
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = torch.tensor([[eos, bos, bos, 5, 6], [bos, 5, 6, eos, eos], [bos, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=ids, attention_mask=mask)
    findings = watcher.report().findings
    assert [(finding.pitfall, finding.severity) for finding in findings] == [("S1", "error"), ("P21", "error"), ("P8", "warning")]
    left_padding, duplicate_bos, pad_as_eos = (finding.evidence for finding in findings)
    assert left_padding == {"left_padded_rows": 1, "forwards": 1, "max_pad": 1, "rows_in_batch": 3}
    assert duplicate_bos == {"rows": 1, "bos_id": bos} and pad_as_eos == {"rows": 1, "pad_id": eos}


def test_a_masked_eos_is_not_flagged_in_a_no_grad_forward_nor_with_a_distinct_pad():
    model, tokenizer = gpt2_with_pad_as_eos()
    eos = tokenizer.eos_token_id
    ids, mask = torch.tensor([[5, 6, eos, eos]]), torch.tensor([[1, 1, 0, 0]])
    with watch(model, tokenizer=tokenizer) as watcher:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    assert "P8" not in watcher.report().pitfalls()
    model, tokenizer = tiny_model("gpt2", seed=1)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    with watch(model, tokenizer=tokenizer) as watcher:
        model(input_ids=ids, attention_mask=mask)
    assert "P8" not in watcher.report().pitfalls()


def generate_from_right_padded_prompts(model):
    """A prompt forward on two rows, the second right-padded, and two cached decode steps after it."""
    ids, mask = torch.tensor([[5, 6, 7], [5, 6, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values  # the prompts' forward
        token = torch.tensor([[8], [8]])
        for step in range(2):
            extended = torch.cat([mask, torch.ones(2, step + 1, dtype=mask.dtype)], 1)
            model(input_ids=token, attention_mask=extended, past_key_values=cache, use_cache=True)


def test_decoding_after_right_padded_prompts_is_flagged_once_at_the_prompt_forward():
    model, tokenizer = tiny_model("gpt2", seed=1)
    with watch(model, tokenizer=tokenizer) as watcher:
        generate_from_right_padded_prompts(model)
    (finding,) = [finding for finding in watcher.report().findings if finding.pitfall == "S2"]
    line = next(number for number, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith("# the prompts' forward"))
    assert finding.where == f"{__file__}:{line}" and finding.evidence == {"rows": 1, "generations": 1}
    assert watcher.report().observed["decode_forwards"] == 2


def test_the_generations_from_one_line_are_counted():
    model, tokenizer = tiny_model("gpt2", seed=1)
    with watch(model, tokenizer=tokenizer) as watcher:
        for _ in range(3):
            generate_from_right_padded_prompts(model)
    (finding,) = [finding for finding in watcher.report().findings if finding.pitfall == "S2"]
    assert finding.evidence == {"rows": 3, "generations": 3}


def test_a_finding_keeps_its_most_severe_message_and_sums_its_counts():
    model, _ = tiny_model("gpt2", seed=1)
    watcher = Watch(model)
    watcher._flag("P7", "warning", "harmless", where="trainer.py:1", forwards=1, dropout_max=0.0)
    watcher._flag("P7", "error", "dropout on", where="trainer.py:1", forwards=1, dropout_max=0.1)
    watcher._flag("P7", "warning", "harmless", where="trainer.py:1", forwards=1, dropout_max=0.0)
    (finding,) = watcher.report().findings
    assert (finding.severity, finding.message) == ("error", "dropout on")
    assert finding.evidence == {"forwards": 3, "dropout_max": 0.0}  # counts summed, other evidence the latest


def test_special_tokens_name_the_pad_id_only_when_it_is_an_eos_id():
    model, tokenizer = tiny_model("gpt2", seed=1)
    stop_ids, bos_id, pad_id_if_eos = observe.special_tokens(model, tokenizer)
    assert tokenizer.eos_token_id in stop_ids and bos_id == tokenizer.bos_token_id and pad_id_if_eos is None
    tokenizer.pad_token_id = tokenizer.eos_token_id
    assert observe.special_tokens(model, tokenizer)[2] == tokenizer.eos_token_id
    assert observe.token_ids(torch.tensor([2, 3])) == [2, 3] and observe.token_ids(None) == [] and observe.token_ids(4) == [4]


def test_row_stats_lists_the_padded_rows_that_hold_a_real_token():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    stats = observe.row_stats(torch.ones_like(mask), mask, None, None)
    assert stats["left_padded"] == [2] and stats["right_padded"] == [1]  # the all-pad row holds no real token


def test_row_layout_counts_padded_and_packed_rows():
    ids = torch.ones(3, 5, dtype=torch.long)
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = torch.tensor([[0, 0, 1, 2, 3], [0, 1, 0, 1, 2], [0, 1, 2, 3, 4]])
    assert observe.row_layout(ids, mask, {"position_ids": positions}) == (3, 1, 1)
    assert observe.row_layout(ids, None, {"cu_seq_lens_q": torch.tensor([0, 2, 5])}) == (3, 0, 1)


def test_unchanged_fraction_of_an_optimiser_step():
    parameter = torch.tensor([1.0, 2.0, 3.0, 4.0])
    before_step = parameter.clone()
    parameter[0] += 1.0
    assert observe.unchanged_fraction([(parameter, before_step)]) == 0.75


def test_paired_prompt_gaps_compare_the_two_halves_of_a_paired_batch():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 5]])  # rows i and i + 2 share the prompt 1 2 3
    mask = torch.ones_like(ids)
    moved = torch.ones_like(ids, dtype=torch.bool)
    assert observe.paired_prompt_gaps(ids, mask, moved) == (0, 0)
    moved[0, 0] = False  # the first pair's first prompt position receives gradient on one side only
    assert observe.paired_prompt_gaps(ids, mask, moved) == (1, 1)
    assert observe.paired_prompt_gaps(ids[:3], mask[:3], moved[:3]) is None  # an odd count of rows: not paired
