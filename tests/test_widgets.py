"""Widget logic without a browser: set a control's value, check what the observer produced."""

import matplotlib

matplotlib.use("Agg")

from workbench.pitfalls.nb01_position_ids import position_drift_explorer  # noqa: E402
from workbench.pitfalls.nb02_right_padding_flash_attention import padding_side_explorer  # noqa: E402
from workbench.pitfalls.nb03_eos_termination import eos_explorer  # noqa: E402
from workbench.pitfalls.nb04_dpo_loss_mask import dpo_mask_explorer  # noqa: E402
from workbench.pitfalls.nb05_grpo_loss_normalization import loss_mode_explorer  # noqa: E402
from workbench.pitfalls.nb06_temperature import temperature_explorer  # noqa: E402
from workbench.pitfalls.nb07_dropout import dropout_explorer  # noqa: E402
from workbench.pitfalls.nb08_pad_equals_eos import pad_eos_explorer  # noqa: E402
from workbench.pitfalls.nb09_kl_estimators import kl_gradient_explorer  # noqa: E402
from workbench.pitfalls.nb10_grad_accumulation import grad_accumulation_explorer  # noqa: E402
from workbench.pitfalls.nb12_logprob_mismatch import log_ratio_explorer  # noqa: E402
from workbench.viz import explorer as wb  # noqa: E402


def test_drift_explorer_redraws_when_the_fix_is_toggled():
    explorer = position_drift_explorer(["12+7=19", "3*4=12", "88-9=79"])
    assert explorer.renders == 1 and explorer.last["max_drift"] > 1e-2  # gpt2, position_ids=model
    explorer.controls["position_ids"].value = "mask"
    assert explorer.renders == 2 and explorer.last["max_drift"] < 1e-4
    explorer.controls["arch"].value = "llama"
    explorer.controls["position_ids"].value = "model"
    assert explorer.last["max_drift"] < 1e-4  # RoPE: float noise only


def test_loss_mode_explorer_changes_weights_with_the_mode():
    explorer = loss_mode_explorer()
    token_mean = explorer.last["weights"]
    assert len(set(round(w, 12) for w in token_mean)) == 1  # every token the same weight
    explorer.controls["mode"].value = "seq-mean-token-mean"
    assert explorer.last["weights"][0] > explorer.last["weights"][-1]  # short responses weigh more per token


def test_dpo_mask_explorer_counts_prompt_rows(tokenizer):
    from workbench.trainers.dpo import collate_preferences

    pairs = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+3=", "chosen": "15", "rejected": "16"}]
    explorer = dpo_mask_explorer(collate_preferences(tokenizer, pairs))
    assert explorer.last["rows_counting_prompt"] == 2  # the bug: the two rejected rows
    explorer.controls["prompt_mask"].value = "both"
    assert explorer.last["rows_counting_prompt"] == 0
    explorer.controls["prompt_mask"].value = "none"
    assert explorer.last["rows_counting_prompt"] == 4


def test_eos_explorer_reports_cost_for_the_chosen_budget():
    from workbench.modeling.models import load

    model, tokenizer = load("tiny-arith-qwen2")
    explorer = eos_explorer(model, tokenizer, ["1+2=", "12+34=", "5*5=", "9-3="])
    explorer.controls["batch_size"].value = 4
    explorer.controls["max_new_tokens"].value = 10
    assert explorer.last["bug"]["decode_steps"] == 10 > explorer.last["fix"]["decode_steps"]


def test_padding_side_explorer_counts_divergent_rows():
    from workbench.modeling.models import load

    models = {"tiny-arith-qwen2": load("tiny-arith-qwen2")}
    explorer = padding_side_explorer(models, ["1+2=", "12+34=", "5*5=", "99-3="])
    assert explorer.last["divergent_rows"] > 0
    explorer.controls["side"].value = "left"
    assert explorer.last["divergent_rows"] == 0


def test_temperature_and_dropout_explorers_toggle_the_fix():
    from workbench.modeling.models import load

    model, tokenizer = load("tiny-arith-qwen2")
    prompts = ["1+2=", "12+34=", "5*5=", "99-3="]
    explorer = temperature_explorer(model, tokenizer, prompts)
    assert explorer.last["max_ratio_deviation"] > 1e-2
    explorer.controls["rescale"].value = True
    assert explorer.last["max_ratio_deviation"] < 1e-4
    gpt2, gpt2_tokenizer = load("tiny-arith-gpt2")
    explorer = dropout_explorer(gpt2, gpt2_tokenizer, prompts)
    assert explorer.last["max_ratio_deviation"] > 1e-2
    explorer.controls["disable"].value = True
    assert explorer.last["max_ratio_deviation"] < 1e-4


def test_pad_eos_and_accumulation_explorers(tokenizer):
    import torch

    from workbench.tasks import Problem

    explorer = pad_eos_explorer(tokenizer, [Problem("1+2=", "3"), Problem("12+3=", "15")])
    assert explorer.last["eos_kept"] == 0
    explorer.controls["pad_equals_eos"].value = False
    assert explorer.last["eos_kept"] == 2
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    explorer = grad_accumulation_explorer(mask, [1, 2, 4])
    assert explorer.last["tokens"] == [2, 4, 1, 3]
    explorer.controls["micro_batches"].value = 1
    assert explorer.last["bug_weights"] == [explorer.last["fix_weight"]]


def test_result_browsing_explorers():
    import torch

    histories = {"a": [{"x": 0.0}, {"x": 1.0}], "b": [{"x": 5.0}, {"x": 2.0}]}  # no "step": the explorer numbers them
    explorer = wb.curve_explorer(histories, "x", "value")
    assert explorer.last == {"first": 0.0, "last": 1.0}
    explorer.controls["run"].value = "b"
    assert explorer.last == {"first": 5.0, "last": 2.0}
    results = {"bf16 rollout": {"log_ratio": torch.tensor([0.1, -0.2]), "max_ratio_deviation": 0.2},
               "fp32 rollout": {"log_ratio": torch.tensor([0.0, 0.0]), "max_ratio_deviation": 0.0}}
    explorer = log_ratio_explorer(results)
    assert explorer.last["max_ratio_deviation"] == 0.2
    explorer.controls["rollout"].value = "fp32 rollout"
    assert explorer.last["max_ratio_deviation"] == 0.0
    gradients = {0.1: {n: {"cosine": 1.0, "norm_ratio": 1.0} for n in ("k1 in reward", "k1 in loss", "k2 in loss", "k3 in loss")},
                 0.2: {n: {"cosine": 0.5, "norm_ratio": 1.0} for n in ("k1 in reward", "k1 in loss", "k2 in loss", "k3 in loss")}}
    explorer = kl_gradient_explorer([0.1, 0.2], {0.1: {"exact_kl": 0.01}, 0.2: {"exact_kl": 0.1}}, gradients)
    assert explorer.last["k2 in loss"]["cosine"] == 0.5
    explorer.controls["scale_index"].value = 0
    assert explorer.last["k2 in loss"]["cosine"] == 1.0
