"""``trainers.base``: the start every trainer shares refuses to train through an attention back-end whose gradients
were measured wrong or not verified at the model's head dim, release and GPU (``core.attention_backward``: flash-attn 4,
docs/GPU.md), names the measurement and both fixes, trains where it was measured right, and trains when the config opts
in. The back-end is only named on the model's config here (no flash kernel runs on a CPU), and the release and GPU of
the measurement are patched in where a test needs them: the check reads what the trainers read."""

import pytest

from workbench.core.errors import AttentionBackwardError, InputError, RunFolderInUse
from workbench.modeling.tiny import tiny_model
from workbench.tasks import Problem, rl_problems
from workbench.trainers.checkpointing import latest_checkpoint
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.trainers.ppo import PPOConfig, PPOTrainer
from workbench.trainers.sft import SFTConfig, SFTTrainer

PROBLEMS = [Problem(p.prompt, p.answer) for p in rl_problems(4)]
PAIRS = [{"prompt": p.prompt, "chosen": p.answer, "rejected": p.answer + "1"} for p in PROBLEMS]
TRAINERS = {
    "grpo": lambda m, t, opt_in: GRPOTrainer(m, t, PROBLEMS, GRPOConfig(steps=1, progress=False, train_with_unverified_attention=opt_in)),
    "ppo": lambda m, t, opt_in: PPOTrainer(m, t, PROBLEMS, PPOConfig(steps=1, progress=False, train_with_unverified_attention=opt_in)),
    "dpo": lambda m, t, opt_in: DPOTrainer(m, t, PAIRS, DPOConfig(steps=1, progress=False, train_with_unverified_attention=opt_in)),
    "sft": lambda m, t, opt_in: SFTTrainer(m, t, PROBLEMS, SFTConfig(steps=1, progress=False, train_with_unverified_attention=opt_in)),
}


def _model(implementation: str, **overrides):
    model, tokenizer = tiny_model("qwen2", seed=0, **overrides)  # head dim 16 (hidden 64, 4 heads) unless overridden
    model.config._attn_implementation = implementation
    return model, tokenizer


@pytest.fixture
def on_the_measured_h100(monkeypatch):
    """The release and GPU generation of the measurement (flash-attn-4 4.0.0b36, compute capability 9.0)."""
    from workbench.core import attention_backward

    monkeypatch.setattr(attention_backward, "installed_release", lambda implementation: "4.0.0b36")
    monkeypatch.setattr(attention_backward, "device_capability", lambda model: "9.0")


@pytest.mark.parametrize("kind", TRAINERS)
def test_training_through_flash_attention_4_is_refused_with_the_measurement_and_the_fixes(kind, on_the_measured_h100):
    with pytest.raises(AttentionBackwardError) as refused:
        TRAINERS[kind](*_model("flash_attention_4"), False)
    message = str(refused.value)
    for part in ("flash_attention_4", "head dim 16 ", "measured wrong", "docs/GPU.md", "attn_implementation='sdpa'",
                 "train_with_unverified_attention=True"):
        assert part in message


@pytest.mark.parametrize("kind", TRAINERS)
def test_flash_attention_4_trains_where_it_was_measured_right_and_is_refused_where_unmeasured(kind, on_the_measured_h100):
    assert TRAINERS[kind](*_model("flash_attention_4", hidden_size=256), False) is not None  # head dim 64
    with pytest.raises(AttentionBackwardError, match="head dim 40 .*not verified"):
        TRAINERS[kind](*_model("flash_attention_4", hidden_size=160), False)


def test_off_the_measured_machine_flash_attention_4_is_unverified():
    with pytest.raises(AttentionBackwardError, match="release unknown.*not verified"):
        TRAINERS["grpo"](*_model("flash_attention_4", hidden_size=256), False)


@pytest.mark.parametrize("kind", TRAINERS)
def test_the_opt_in_and_the_verified_back_ends_train(kind):
    assert TRAINERS[kind](*_model("flash_attention_4"), True) is not None  # the opt-in: built, not refused
    for implementation in ("sdpa", "eager", "flash_attention_2"):
        assert TRAINERS[kind](*_model(implementation), False) is not None


def test_a_ppo_critic_of_its_own_under_flash_attention_4_is_refused_too():
    from workbench.trainers.critic import ValueModel

    policy, tokenizer = _model("sdpa")
    critic = ValueModel.from_policy(_model("flash_attention_4")[0])
    with pytest.raises(AttentionBackwardError, match="the critic runs attn_implementation='flash_attention_4'"):
        PPOTrainer(policy, tokenizer, PROBLEMS, PPOConfig(steps=1, progress=False), critic=critic)


def test_the_opt_in_may_change_on_resume(tmp_path):
    # it says whether to train, not what is computed: a run saved with it resumes after the policy was reloaded with sdpa
    config = dict(steps=1, progress=False, output_dir=str(tmp_path), prompts_per_step=2, num_generations=2, max_new_tokens=2)
    GRPOTrainer(*_model("sdpa"), PROBLEMS, GRPOConfig(**config, train_with_unverified_attention=True)).train()
    resumed = GRPOTrainer(*_model("sdpa"), PROBLEMS, GRPOConfig(**{**config, "steps": 2}))
    assert resumed.maybe_resume() and resumed.step == 1


def test_a_ppo_critic_of_its_own_at_a_head_dim_measured_right_is_accepted(on_the_measured_h100):
    from workbench.trainers.critic import ValueModel

    policy, tokenizer = _model("sdpa")
    critic = ValueModel.from_policy(_model("flash_attention_4", hidden_size=256)[0])  # head dim 64
    assert PPOTrainer(policy, tokenizer, PROBLEMS, PPOConfig(steps=1, progress=False), critic=critic) is not None


def test_a_training_into_a_folder_another_training_holds_is_refused_and_writes_nothing(tmp_path, hold_elsewhere):
    model, tokenizer = tiny_model("qwen2", seed=0)
    run = tmp_path / "run"
    trainer = GRPOTrainer(model, tokenizer, PROBLEMS, GRPOConfig(steps=1, progress=False, output_dir=str(run)))
    with hold_elsewhere(run):
        with pytest.raises(RunFolderInUse, match="another training"):
            trainer.train()
    assert trainer.step == 0 and trainer.history == [] and not (run / "checkpoints").exists()
    trainer.train()  # once the folder is free
    assert trainer.step == 1 and latest_checkpoint(run).name == "step-000001"


class _OtherRank:
    """A data-parallel group as a process other than the main one sees it; ``max`` returns what the main process put in."""

    enabled, is_main_process = True, False

    def __init__(self, main_found_it_held: bool):
        self.main_found_it_held = main_found_it_held

    def max(self, value: float) -> float:
        return max(value, 1.0 if self.main_found_it_held else 0.0)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("held_by_another", [True, False])
def test_every_process_of_a_group_stops_when_the_main_one_finds_the_folder_held(tmp_path, held_by_another):
    model, tokenizer = tiny_model("qwen2", seed=0)
    trainer = GRPOTrainer(model, tokenizer, PROBLEMS, GRPOConfig(steps=1, progress=False, output_dir=str(tmp_path / "run")))
    trainer.dist = _OtherRank(held_by_another)
    if held_by_another:
        with pytest.raises(RunFolderInUse, match="the main process could not take this output folder"):
            with trainer.hold_output_dir():
                pass
        assert trainer.dist.closed  # the group left together, before the error
    else:
        with trainer.hold_output_dir():
            pass
        assert not hasattr(trainer.dist, "closed")
    assert not (tmp_path / "run").exists()  # a process other than the main one never takes (or creates) the folder


class _MainRank(_OtherRank):
    """The main process of a data-parallel group; ``max`` records what it told the others."""

    is_main_process = True

    def __init__(self):
        super().__init__(False)
        self.sent = None

    def max(self, value: float) -> float:
        self.sent = value
        return value


def test_a_main_process_that_cannot_make_the_folder_tells_the_group_before_it_stops(tmp_path):
    """Any error of the main process while taking the folder goes to the group, not only ``RunFolderInUse``: a mkdir
    error that skipped the all-reduce would leave the other ranks waiting in it (gloo then fails them with a connection
    error instead of the refusal)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    model, tokenizer = tiny_model("qwen2", seed=0)
    trainer = GRPOTrainer(model, tokenizer, PROBLEMS, GRPOConfig(steps=1, progress=False, output_dir=str(blocker / "run")))
    trainer.dist = _MainRank()
    with pytest.raises(InputError, match="cannot make the output folder"):
        with trainer.hold_output_dir():
            pass
    assert trainer.dist.sent == 1.0 and trainer.dist.closed


def test_a_config_field_of_the_wrong_type_is_a_config_error_naming_it():
    """``GRPOConfig(steps="3")`` must not reach the range check (a bare TypeError there), nor ``packed=1`` pass unchecked."""
    from workbench.core.errors import ConfigError

    for config_cls, field, value, words in [(GRPOConfig, "steps", "3", "must be an int"), (GRPOConfig, "steps", True, "must be an int"),
                                            (GRPOConfig, "packed", 1, "must be True or False"),
                                            (DPOConfig, "beta", "0.1", "must be a number")]:
        with pytest.raises(ConfigError, match=rf"{config_cls.__name__}\.{field}={value!r} {words}"):
            config_cls(**{field: value})
    assert GRPOConfig(temperature=1).temperature == 1  # an int is a number


def test_rows_that_are_not_problems_or_pairs_are_refused_with_the_fix():
    model, tokenizer = tiny_model("qwen2", seed=0)
    with pytest.raises(ValueError, match=r"GRPOTrainer: prompt row 0 is a str \('1\+1='\) without prompt, answer; pass "
                                         r"workbench.tasks.Problem rows"):
        GRPOTrainer(model, tokenizer, ["1+1="], GRPOConfig(steps=1, progress=False))
    with pytest.raises(ValueError, match=r"PPOTrainer: prompt row 1 is a dict .* without prompt, answer"):
        PPOTrainer(model, tokenizer, [PROBLEMS[0], {"prompt": "1+1=", "answer": "2"}], PPOConfig(steps=1, progress=False))
    with pytest.raises(ValueError, match=r"DPOTrainer: preference row 0 is a dict .* without rejected; pass dicts"):
        DPOTrainer(model, tokenizer, [{"prompt": "1+1=", "chosen": "2"}], DPOConfig(steps=1, progress=False))
