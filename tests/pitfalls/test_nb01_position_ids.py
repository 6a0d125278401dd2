"""nb01_position_ids: metrics(), figures and the drift explorer (which notebook 00 shows too)."""

from pitfall_fakes import axes, check_metrics, drew, fake_runs

from workbench.modeling.tiny import ARCHITECTURES, tiny_model
from workbench.pitfalls import nb01_position_ids as position_ids


def fake_sweep(pad_lengths=(0, 4)):
    return {(a, d, s, m): [0.5 if (a == "gpt2" and m == "model") else 0.0 for _ in pad_lengths]
            for a in ARCHITECTURES for d in ("fp32", "bf16") for s in ("left", "right") for m in ("model", "mask")}


def test_metrics_returns_write_metrics_arguments():
    policy, _ = tiny_model("gpt2")
    mismatch = {(n, m): {"max_ratio_deviation": 0.3 if m == "model" else 0.0, "sequence_kl_k1": 0.0}
                for n in ("a", "b") for m in ("model", "mask")}
    runs = fake_runs(position_ids.PPO_VARIANTS, ("reward", "kl", "first_logp_gap"))
    kwargs = position_ids.metrics(sweep=fake_sweep(), mismatch=mismatch, policy=policy, names=("a", "b"), runs=runs,
                         effects=position_ids.ppo_effects(runs), settings={"steps": 4})
    check_metrics(kwargs, "01_position_ids")
    assert kwargs["reproduced"] and kwargs["fixed"] and kwargs["headline"]["bug"] == 0.5
    assert set(kwargs["metrics"]["ppo_effects"]) == {"reward", "kl", "heldout_accuracy"}
    assert kwargs["metrics"]["first_epoch_ratio_deviation_without"] == {"a": 0.3, "b": 0.3}


def test_figures_draw():
    assert drew(position_ids.figure_drift_per_text(["a", "b"], {"model": [0.1, 0.2], "mask": [0.0, 1e-6]}))
    assert drew(position_ids.figure_drift_heatmap(fake_sweep()))
    assert drew(position_ids.figure_drift_vs_pad(fake_sweep(), (0, 4)))
    assert drew(position_ids.figure_first_step({("a", "model"): {"max_ratio_deviation": 1.0, "max_abs_logp_gap": 6.0},
                                       ("a", "mask"): {"max_ratio_deviation": 0.0, "max_abs_logp_gap": 0.0}}))
    fig, ax = axes(4)
    position_ids.plot_ppo(ax, fake_runs(position_ids.PPO_VARIANTS, ("reward", "kl", "first_logp_gap")))
    assert drew(fig)
    assert "GPT-2" in position_ids.drift_summary(fake_sweep())


def test_drift_explorer_redraws_when_the_fix_is_toggled():
    explorer = position_ids.position_drift_explorer(["12+7=19", "3*4=12", "88-9=79"])
    assert explorer.renders == 1 and explorer.last["max_drift"] > 1e-2  # gpt2, position_ids=model
    explorer.controls["position_ids"].value = "mask"
    assert explorer.renders == 2 and explorer.last["max_drift"] < 1e-4
    assert "float rounding" in position_ids.drift_reading(explorer.last["max_drift"])  # what the title says of it
    explorer.controls["arch"].value = "llama"
    explorer.controls["position_ids"].value = "model"
    assert explorer.last["max_drift"] < 1e-4  # RoPE: float noise only


def test_drift_reading_and_note_name_the_float_rounding_line():
    assert position_ids.drift_reading(0.0) == "largest drift exactly 0"
    assert position_ids.drift_reading(4.8e-7) == "largest drift 4.8e-07 nats (float rounding: line at 1e-04)"
    assert "above float rounding" in position_ids.drift_reading(0.25)
    assert "+4 pads" in position_ids.drift_per_text_note(4) and "1e-04 nats" in position_ids.drift_per_text_note(4)


def test_position_ids_verdict_needs_a_drift():
    assert position_ids.verdict(0.4, 0.0) == (True, True)
    assert position_ids.verdict(3e-7, 3e-7) == (False, True)  # RoPE in fp32: positions differ, no drift
    assert position_ids.verdict(0.4, 0.3) == (True, False)


def test_position_ids_bf16_conclusion_is_chosen_by_the_numbers():
    sweep = {(a, "bf16", "left", m): [v] for a in ("llama", "qwen2") for m, v in (("model", 2e-3), ("mask", 2e-3))}
    assert position_ids.bf16_rope_drift(sweep) == (2e-3, 2e-3)
    assert "changes nothing measurable" in position_ids.bf16_rope_sentence(*position_ids.bf16_rope_drift(sweep))
    sweep = {(a, "bf16", "left", m): [v] for a in ("llama", "qwen2") for m, v in (("model", 2e-3), ("mask", 0.0))}
    assert "visible above" in position_ids.bf16_rope_sentence(*position_ids.bf16_rope_drift(sweep))


def test_logprob_drift_is_the_largest_drift_per_text():
    model, tokenizer = tiny_model("gpt2")
    rows = [tokenizer(t)["input_ids"] for t in ("12+7=19", "3*4=12")] + [[5]]
    per_text = position_ids.per_text_drift(model, rows, pad_token_id=tokenizer.pad_token_id, extra_pad=4, position_ids="model")
    assert per_text[2] == 0.0  # a row of one token has no target to score
    assert position_ids.logprob_drift(model, rows, pad_token_id=tokenizer.pad_token_id, extra_pad=4) == max(per_text) > 1e-2


def test_not_shown_names_a_rotary_model_without_drift_only():
    rope, _ = tiny_model("qwen2")
    learned, _ = tiny_model("gpt2")
    assert "rotary" in position_ids.not_shown(rope, 2e-6) and "realistic-gpt2" in position_ids.not_shown(rope, 2e-6)
    assert position_ids.not_shown(rope, 0.5) is None  # drift measured: shown
    assert position_ids.not_shown(learned, 2e-6) is None  # learned positions: a small drift is a result, not a blind spot
