"""``python -m workbench train <kind>``: every config field is a documented, typed option."""

import pytest

from workbench.core.config_options import field_docs
from workbench.trainers.grpo import GRPOConfig
from workbench.trainers.ppo import PPOConfig


def cli(capsys, *args):
    """Run the command line in-process: ``(exit code, stdout, stderr)``."""
    from workbench.cli.main import main

    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse: --help exits 0, a bad option 2
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_field_docs_read_sections_and_docstrings_through_the_bases():
    docs = field_docs(GRPOConfig)
    assert docs["num_generations"] == ("Rollout", "Completions sampled per prompt (the group size G ≥ 2).")
    assert docs["position_ids"][0] == "Pitfall switches (the default is the fix)"  # declared in RolloutConfig
    assert docs["kl_aggregation"][0] == "Pitfall switches (the default is the fix)"  # declared in GRPOConfig
    assert docs["learning_rate"][0] == "Optimisation" and "AdamW" in docs["learning_rate"][1]
    assert docs["mini_batches"][1].startswith("Optimiser steps per PPO epoch") is False  # GRPO keeps the base text
    assert field_docs(PPOConfig)["mini_batches"][1].startswith("Optimiser steps per PPO epoch")


def test_every_field_has_a_docstring():
    from workbench.trainers.dpo import DPOConfig
    from workbench.trainers.sft import SFTConfig

    for config in (PPOConfig, GRPOConfig, DPOConfig, SFTConfig):
        missing = [name for name, (_, doc) in field_docs(config).items() if not doc]
        assert not missing, f"{config.__name__}: {missing}"


def test_train_help_documents_the_fields_by_section(capsys):
    code, out, _ = cli(capsys, "train", "grpo", "--help")
    assert code == 0
    assert "--num_generations INT" in out and "Completions sampled per prompt" in out
    assert "pitfall switches" in out and "(default: 'with_loss')" in out


@pytest.mark.parametrize("args, message", [
    (["--num_generations", "many"], "num_generations"),
    (["--set", "num_generations=1"], "num_generations"),
    (["--set", "nonsense=1"], "no field 'nonsense'"),
])
def test_bad_values_exit_2_naming_the_field(args, message, capsys):
    code, _, err = cli(capsys, "train", "grpo", "--steps", "0", *args)
    assert code == 2 and message in err


def test_typed_options_reach_the_config(tmp_path):
    import argparse

    from workbench.cli.train import add_arguments, build_config, config_values
    from workbench.trainers.registry import trainer_classes

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["grpo", "--num_generations", "4", "--packed", "true", "--set", "beta=0.1"])
    config = build_config(trainer_classes("grpo")[0], args.set, str(tmp_path), config_values(args))
    assert (config.num_generations, config.packed, config.beta, config.output_dir) == (4, True, 0.1, str(tmp_path))
