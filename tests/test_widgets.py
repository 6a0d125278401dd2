"""Widget logic without a browser: set a control's value, check what the observer produced."""

import matplotlib

matplotlib.use("Agg")

from workbench import widgets as wb  # noqa: E402


def test_drift_explorer_redraws_when_the_fix_is_toggled():
    explorer = wb.position_drift_explorer(["12+7=19", "3*4=12", "88-9=79"])
    assert explorer.renders == 1 and explorer.last["max_drift"] > 1e-2  # gpt2, position_ids=model
    explorer.controls["position_ids"].value = "mask"
    assert explorer.renders == 2 and explorer.last["max_drift"] < 1e-4
    explorer.controls["arch"].value = "llama"
    explorer.controls["position_ids"].value = "model"
    assert explorer.last["max_drift"] < 1e-4  # RoPE: float noise only


def test_loss_mode_explorer_changes_weights_with_the_mode():
    explorer = wb.loss_mode_explorer()
    token_mean = explorer.last["weights"]
    assert len(set(round(w, 12) for w in token_mean)) == 1  # every token the same weight
    explorer.controls["mode"].value = "seq-mean-token-mean"
    assert explorer.last["weights"][0] > explorer.last["weights"][-1]  # short responses weigh more per token


def test_dpo_mask_explorer_counts_prompt_rows(tokenizer):
    from workbench.trainers.dpo import collate_preferences

    pairs = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+3=", "chosen": "15", "rejected": "16"}]
    explorer = wb.dpo_mask_explorer(collate_preferences(tokenizer, pairs))
    assert explorer.last["rows_counting_prompt"] == 2  # the bug: the two rejected rows
    explorer.controls["prompt_mask"].value = "both"
    assert explorer.last["rows_counting_prompt"] == 0
    explorer.controls["prompt_mask"].value = "none"
    assert explorer.last["rows_counting_prompt"] == 4


def test_eos_explorer_reports_cost_for_the_chosen_budget():
    from workbench.models import load

    model, tokenizer = load("tiny-arith-qwen2")
    explorer = wb.eos_explorer(model, tokenizer, ["1+2=", "12+34=", "5*5=", "9-3="])
    explorer.controls["batch_size"].value = 4
    explorer.controls["max_new_tokens"].value = 10
    assert explorer.last["bug"]["decode_steps"] == 10 > explorer.last["fix"]["decode_steps"]


def test_padding_side_explorer_counts_divergent_rows():
    from workbench.models import load

    models = {"tiny-arith-qwen2": load("tiny-arith-qwen2")}
    explorer = wb.padding_side_explorer(models, ["1+2=", "12+34=", "5*5=", "99-3="])
    assert explorer.last["divergent_rows"] > 0
    explorer.controls["side"].value = "left"
    assert explorer.last["divergent_rows"] == 0
