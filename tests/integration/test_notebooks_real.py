"""The catalogue on realistic local checkpoints: GPT-2-, Qwen2- and Llama-style folders built
by ``workbench.modeling.realistic`` (byte-level BPE, no pad token, no BOS, several stop ids, bf16 on disk).

The notebooks whose mechanism needs no trained policy (01, 02, 04, 05) reproduce the bug and show the
fix on each checkpoint; the default suite runs each of them on one checkpoint (rotating, so all three
flavours are covered), the other eight pairs are ``slow``. ``slow``: every notebook runs in smoke mode on each
checkpoint without failing; where a checkpoint cannot show a pitfall, ``metrics.json`` says so in
``metrics["not_shown"]`` instead of claiming a verdict.
"""

import json

import pytest

from workbench.catalogue.batch import run_catalogue
from workbench.catalogue.listing import NOTEBOOKS_DIR, find_notebook

CHECKPOINTS = ("realistic-gpt2", "realistic-qwen2", "realistic-llama")
MECHANISM_ONLY = ("01_position_ids", "02_right_padding_flash_attention", "04_dpo_loss_mask", "05_grpo_loss_normalization")
# Notebooks that declare no model (listing.DECLARED_ABSENCES: 33, 35 measure the loss arithmetic) have no checkpoint to swap.
ALL = sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb") if not p.stem.startswith("9")
             and "model" in find_notebook(p.stem).parameters)


def overrides_for(stem: str, checkpoint: str) -> dict:
    """The checkpoint in every model parameter the notebook has, set sensibly."""
    from workbench.catalogue.listing import find_notebook
    from workbench.modeling.realistic import spec_of

    parameters = find_notebook(stem).parameters
    has_template = spec_of(checkpoint.removeprefix("realistic-")).chat_template is not None
    chat_notebooks = ("17_stop_tokens", "19_batch_shape_logprobs", "21_duplicate_bos", "22_multiturn_retokenization")
    out = {"model": checkpoint + "-chat" if stem in chat_notebooks and has_template else checkpoint}
    if "rope_model" in parameters:  # 01: the rotary model to compare with (GPT-2 has learned positions)
        out["rope_model"] = "realistic-qwen2" if checkpoint == "realistic-gpt2" else checkpoint
    if "reference_model" in parameters:  # same tokenizer as the policy, other weights where there are any (the chat-SFT one)
        out["reference_model"] = checkpoint + "-chat" if has_template else checkpoint
    if "architectures" in parameters:  # 02: the generation hazard on this checkpoint
        out["architectures"] = [checkpoint]
    return out


def run_one(tmp_path, stem: str, checkpoint: str) -> dict:
    folder, results = run_catalogue([stem], smoke=True, overrides=overrides_for(stem, checkpoint), out_dir=tmp_path,
                                    progress=False, render_html=False)
    assert results[0].ok, f"{stem} on {checkpoint}: {results[0].error}"
    return json.loads((folder / stem / "metrics.json").read_text())


# The mechanism notebooks run on every realistic checkpoint in `make test-all` (6-40 s each); their tiny-model signatures
# are in the smoke catalogue of the default suite, the realistic checkpoints' own checks in test_real_checkpoints.py.
MECHANISM_PAIRS = [pytest.param(stem, checkpoint, marks=pytest.mark.slow) for stem in MECHANISM_ONLY for checkpoint in CHECKPOINTS]


@pytest.mark.parametrize("stem, checkpoint", MECHANISM_PAIRS)
def test_mechanism_notebooks_reproduce_and_fix_on_realistic_checkpoints(tmp_path, stem, checkpoint):
    payload = run_one(tmp_path, stem, checkpoint)
    assert payload["parameters"]["model"].startswith(checkpoint)
    assert payload["reproduced"] is True and payload["fixed"] is True, payload["metrics"].get("not_shown")


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
@pytest.mark.parametrize("stem", [s for s in ALL if s not in MECHANISM_ONLY])
def test_every_notebook_runs_on_realistic_checkpoints(tmp_path, stem, checkpoint):
    payload = run_one(tmp_path, stem, checkpoint)
    if not (payload["reproduced"] and payload["fixed"]):  # an unshown pitfall is said, not silently judged
        assert payload["metrics"].get("not_shown"), f"{stem} on {checkpoint}: no verdict and no reason recorded"


def test_write_metrics_records_what_a_checkpoint_cannot_show(tmp_path, capsys):
    from workbench.catalogue import notebook_api

    notebook_api.write_metrics(tmp_path, notebook="x", reproduced=False, fixed=True, metrics={"a": 1.0}, not_shown="no EOS ever")
    assert json.loads((tmp_path / "metrics.json").read_text())["metrics"] == {"a": 1.0, "not_shown": ["no EOS ever"]}
    assert "cannot show with this checkpoint: no EOS ever" in capsys.readouterr().out
    notebook_api.write_metrics(tmp_path, notebook="x", reproduced=True, fixed=True, metrics={"a": 1.0}, not_shown=[None])
    assert "not_shown" not in json.loads((tmp_path / "metrics.json").read_text())["metrics"]


def test_cannot_show_reasons_are_chosen_by_the_numbers():
    from workbench.modeling.tiny import tiny_model
    from workbench.pitfalls import nb01_position_ids as position_ids
    from workbench.pitfalls import nb03_eos_termination as eos
    from workbench.pitfalls import nb11_truncated_responses as truncation

    def costs(fix_steps):
        return {64: {"fix": {"finished_fraction": 0.1, "decode_steps": fix_steps}, "bug": {"decode_steps": 32}}}

    assert eos.not_shown(costs(12)) is None  # every response stopped by step 12: the saving is measured
    assert "saves no decode step" in eos.not_shown(costs(32))
    rope, _ = tiny_model("qwen2")
    learned, _ = tiny_model("gpt2")
    assert position_ids.not_shown(rope, 1e-6) and "rotary" in position_ids.not_shown(rope, 1e-6)
    assert position_ids.not_shown(rope, 0.5) is None  # drift measured: shown
    assert position_ids.not_shown(learned, 1e-6) is None  # learned positions: a small drift is a result, not a blind spot
    bug = {"truncated": 40, "truncated_rewarded": 0, "mixed_groups": 3, "pressure": 0.0}
    assert "earns a reward" in truncation.not_shown({truncation.BUG: bug})
    assert truncation.not_shown({truncation.BUG: {**bug, "truncated_rewarded": 5}}) is None


# ---- only `model` set, as a new user does ------------------------------------------------------------------------------
# The reference follows the policy (reference_model=None), and a sample that leaves nothing to measure is recorded in
# metrics["not_shown"], never a traceback. realistic-llama: no pad token, not chat-tuned (few turns end in 22).
ONLY_MODEL_DEFAULT = ("18_padding_metrics", "20_kl_gradient", "22_multiturn_retokenization")


def run_only_model(tmp_path, stems, checkpoint: str) -> dict:
    folder, results = run_catalogue(list(stems), smoke=True, overrides={"model": checkpoint}, out_dir=tmp_path,
                                    progress=False, render_html=False)
    failed = {r.stem: r.error for r in results if not r.ok}
    assert not failed, f"on {checkpoint} with only `model` set: {failed}"
    return {stem: json.loads((folder / stem / "metrics.json").read_text()) for stem in stems}


@pytest.mark.slow  # full training / realistic checkpoints: make test-all
def test_notebooks_with_a_reference_or_turns_run_with_only_model_set(tmp_path):
    payloads = run_only_model(tmp_path, ONLY_MODEL_DEFAULT, "realistic-llama")
    for stem, payload in payloads.items():
        assert payload["parameters"]["model"] == "realistic-llama"
        if not (payload["reproduced"] and payload["fixed"]):
            assert payload["metrics"].get("not_shown"), f"{stem}: no verdict and no reason recorded"
    assert payloads["18_padding_metrics"]["parameters"]["reference_model"] is None
    turns = payloads["22_multiturn_retokenization"]
    if not turns["reproduced"]:
        assert "chat-tuned checkpoint" in " ".join(turns["metrics"]["not_shown"])


def test_retokenization_names_the_remedy_when_nothing_is_measured():
    from workbench.pitfalls import nb22_multiturn_retokenization as p22

    assert "no episode ended its first turn within max_new_tokens=24" in p22.no_episode_reason(24)
    flat = {"episodes": 1, "changed_fraction": 0.0, "max_abs_log_ratio_bug": 0.0, "max_abs_log_ratio_fix": 0.0}
    assert "1 of 24 episodes" in p22.not_shown(flat, 24, 16) and "raise n_episodes / max_new_tokens" in p22.not_shown(flat, 24, 16)
    assert p22.not_shown({**flat, "changed_fraction": 0.5, "max_abs_log_ratio_bug": 3.0}, 24, 16) is None


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
@pytest.mark.parametrize("stem", ALL)
def test_every_notebook_runs_with_only_model_set(tmp_path, stem, checkpoint):
    payload = run_only_model(tmp_path, [stem], checkpoint)[stem]
    if not (payload["reproduced"] and payload["fixed"]):
        assert payload["metrics"].get("not_shown"), f"{stem} on {checkpoint}: no verdict and no reason recorded"
