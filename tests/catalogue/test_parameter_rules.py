"""Notebook parameters checked before any kernel starts: one rule per parameter name (``PARAMETER_RULES``),
applied to the values a run will use; a bad value exits 2 naming the parameter and what it accepts."""

import pytest

from workbench.catalogue.listing import PARAMETER_RULES, SHARED_TOKENIZER, TYPE_ONLY_PARAMETERS, catalogue, resolve_parameters
from workbench.cli.main import main
from workbench.core.errors import ParameterError


def test_every_catalogue_parameter_has_a_rule_or_is_type_only_on_purpose():
    names = {name for info in catalogue() for name in info.parameters}
    assert not set(PARAMETER_RULES) & set(TYPE_ONLY_PARAMETERS)
    assert sorted(names - set(PARAMETER_RULES) - set(TYPE_ONLY_PARAMETERS)) == []  # a new parameter needs a rule
    assert sorted(set(PARAMETER_RULES) - names) == []  # and no rule outlives its parameter


@pytest.mark.parametrize("smoke", [False, True])
def test_every_default_and_smoke_value_passes_its_rule(smoke):
    for info in catalogue():
        resolve_parameters(info, {}, smoke=smoke)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["05", "-p", "seeds", "[]"], ("05_grpo_loss_normalization", "'seeds' = []", "non-empty list")),
        (["05", "-p", "train_steps", "-3"], ("'train_steps' = -3", "an int ≥ 1")),
        (["05", "-p", "modes", "['token-mean', 'token-sum']"], ("'modes'", "'token-sum'", "seq-mean-token-sum-norm")),
        (["16", "-p", "drop_probs", "[0.1, 1.5]"], ("'drop_probs'", "1.5", "probability in [0, 1]")),
        (["05", "-p", "precision", "fp8"], ("'precision' = 'fp8'", "bf16-mixed")),
        (["05", "-p", "model", "/no/such/checkpoint"], ("'model' = '/no/such/checkpoint'", "does not exist", "config.json")),
        (["22", "-p", "model", "realistic-gpt3"], ("'model' = 'realistic-gpt3'", "unknown flavour")),
        (["18", "-p", "reference_model", "realistic-qwen2"],
         ("18_padding_metrics", "model and reference_model must share a tokenizer", "'tiny-arith-qwen2'", "'realistic-qwen2'")),
    ],
)
def test_bad_parameter_exits_2_before_any_kernel(argv, words, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", *argv, "--smoke", "--quiet", "--no-html", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    for word in words:
        assert word in err
    assert not out.exists()  # refused before the run folder (and any notebook folder) was made


def test_rules_check_overrides_given_as_python_values():
    info = next(i for i in catalogue() if i.stem.startswith("05"))
    with pytest.raises(ParameterError, match="'seeds' = \\[0, 'x'\\] holds 'x'"):
        resolve_parameters(info, {"seeds": [0, "x"]})
    with pytest.raises(ParameterError, match="'train_steps' = True"):
        resolve_parameters(info, {"train_steps": True})  # a bool is not a count
    assert resolve_parameters(info, {"seeds": [3], "modes": ["grpo"]})["seeds"] == [3]  # a TRL alias is a known mode


def test_a_shared_tokenizer_pair_passes_and_none_means_the_policy():
    assert SHARED_TOKENIZER == (("model", "reference_model"),)
    info = next(i for i in catalogue() if i.stem.startswith("20"))
    assert info.parameters["reference_model"] is None
    resolve_parameters(info, {"reference_model": "tiny-arith-gpt2"})  # same character tokenizer, other weights
    resolve_parameters(info, {"model": "realistic-qwen2"})  # the reference follows the policy
