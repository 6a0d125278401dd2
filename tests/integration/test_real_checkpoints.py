"""Real checkpoints: what GPT-2-, Qwen2- and Llama-style Hugging Face folders bring, each handled.

The folders are built at test time by ``workbench.modeling.realistic`` (byte-level BPE tokenizers, real
configs): a GPT-2-like one (no pad token, BOS = EOS, dropout 0.1), a Qwen2-like one (no BOS, a ChatML
template, two stop ids, bf16 weights on disk), a Llama-like one (BOS added by the tokenizer and
written by its template).
"""

import json
import shutil

import pytest
import torch

from workbench.cli.main import main
from workbench.core.devices import resolve_device
from workbench.core.errors import ModelLoadError
from workbench.experiments import checkpoints
from workbench.modeling import models, pad_policy, realistic
from workbench.modeling.stop_ids import stop_token_ids
from workbench.tasks import encode_prompts, prompt_ids


@pytest.fixture(scope="module")
def folders():
    return {flavour: realistic.checkpoint(flavour) for flavour in ("gpt2", "qwen2", "llama")}


def test_no_pad_token_gets_a_safe_one_never_eos(folders):
    model, tokenizer = checkpoints.load(folders["gpt2"])
    assert tokenizer.pad_token == pad_policy.ADDED_PAD_TOKEN and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer) == 513  # one row added
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_an_existing_never_generated_special_token_is_preferred(folders, tmp_path):
    folder = tmp_path / "with-reserved"
    shutil.copytree(folders["gpt2"], folder)
    tokenizer = models.load_tokenizer(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|reserved_special_token_0|>"]})
    tokenizer.save_pretrained(str(folder))
    model, tokenizer = checkpoints.load(folder, pad_token="auto")
    assert tokenizer.pad_token == "<|reserved_special_token_0|>"


def test_pad_equal_to_eos_stays_an_error_naming_the_fix(folders):
    with pytest.raises(ModelLoadError, match="pitfall P8"):
        checkpoints.load(realistic.checkpoint("qwen2-base"))
    model, tokenizer = checkpoints.load(realistic.checkpoint("qwen2-base"), pad_token=pad_policy.ADDED_PAD_TOKEN)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_several_stop_ids_from_tokenizer_generation_config_and_template(folders):
    model, tokenizer = checkpoints.load(folders["qwen2"])
    ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert set(stop_token_ids(model, tokenizer)) == ids
    model, tokenizer = checkpoints.load(folders["llama"])
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert eot in stop_token_ids(model, tokenizer, chat_template=True)


def test_bos_conventions(folders):
    _, qwen = checkpoints.load(folders["qwen2"])
    _, gpt2 = checkpoints.load(folders["gpt2"])
    _, llama = checkpoints.load(folders["llama"])
    assert qwen.bos_token_id is None and not models.adds_bos(qwen)
    assert gpt2.bos_token_id == gpt2.eos_token_id and not models.adds_bos(gpt2)
    assert models.adds_bos(llama)
    ids, mask = encode_prompts(qwen, ["12+3="])  # no BOS to add: no crash, no None id
    assert None not in ids.tolist()[0]


def test_chat_template_prompts_carry_exactly_one_bos(folders):
    _, llama = checkpoints.load(folders["llama"])
    templated = prompt_ids(llama, "12+3=", "auto")
    assert templated[0] == llama.bos_token_id and templated[1] != llama.bos_token_id  # the template's BOS only
    raw = prompt_ids(llama, "12+3=", "none")
    assert raw[0] == llama.bos_token_id and len(raw) < len(templated)


def test_bf16_weights_on_disk_load_as_fp32_master_weights(folders):
    config = json.loads((folders["qwen2"] / "config.json").read_text())
    assert "bfloat16" in (config.get("torch_dtype") or config.get("dtype"))
    model, _ = checkpoints.load(folders["qwen2"])
    assert next(model.parameters()).dtype == torch.float32


def test_describe_names_what_the_checkpoint_brings(folders):
    model, tokenizer = checkpoints.load(folders["gpt2"])
    text = models.describe(model, tokenizer, disk_dtype="float32")
    assert "learned absolute" in text and "resid_pdrop" in text and "stop ids" in text


@pytest.mark.parametrize("kind", ["ppo", "grpo", "dpo", "sft"])
@pytest.mark.parametrize("flavour", ["gpt2", "qwen2", "llama"])
def test_every_trainer_runs_two_steps_on_every_checkpoint_without_extra_flags(folders, flavour, kind, capsys):
    argv = ["train", kind, "--model", str(folders[flavour]), "--limit", "32", "--quiet", "--set", "steps=2"]
    if kind == "ppo":
        argv += ["--prompts_per_step", "8"]
    if kind == "grpo":
        argv += ["--prompts_per_step", "2", "--num_generations", "4"]
    if kind in ("dpo", "sft"):
        argv += ["--batch_size", "4"]
    assert main(argv) == 0, capsys.readouterr().err


def test_device_auto_and_a_missing_gpu():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA"):
            resolve_device("cuda")


def test_learning_rate_auto_by_parameter_count():
    from workbench.trainers.dpo import DPOConfig
    from workbench.trainers.grpo import GRPOConfig

    class Sized(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(n, device="meta"))

    assert GRPOConfig().resolve_learning_rate(Sized(400_000)) == 2e-4  # the tuned tiny-model value
    assert GRPOConfig().resolve_learning_rate(Sized(500_000_000)) == pytest.approx(1e-5)
    assert GRPOConfig().resolve_learning_rate(Sized(7_000_000_000)) == pytest.approx(1e-6)
    assert DPOConfig().resolve_learning_rate(Sized(7_000_000_000)) == pytest.approx(5e-7)
    assert GRPOConfig(learning_rate=3e-6).resolve_learning_rate(Sized(7_000_000_000)) == 3e-6


def test_bf16_mixed_keeps_fp32_weights_and_step0_invariants():
    from workbench.tasks import rl_problems
    from workbench.trainers.grpo import GRPOConfig, GRPOTrainer

    model, tokenizer = checkpoints.load("tiny-arith-qwen2")
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=2, num_generations=4, max_new_tokens=4, beta=0.1,
                        mini_batches=2, precision="bf16-mixed")
    step = GRPOTrainer(model, tokenizer, rl_problems(8), config).train()[0]
    assert next(model.parameters()).dtype == torch.float32
    assert step["ratio_deviation_first"] == 0.0 and step["kl_first"] == 0.0


def test_pure_bf16_is_the_documented_hazard(capsys):
    from workbench.tasks import rl_problems
    from workbench.trainers.grpo import GRPOConfig, GRPOTrainer

    model, tokenizer = checkpoints.load("tiny-arith-qwen2")
    GRPOTrainer(model, tokenizer, rl_problems(8), GRPOConfig(steps=0, progress=False, precision="bf16"))
    assert next(model.parameters()).dtype == torch.bfloat16
    assert "pitfall P23" in capsys.readouterr().out


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_ppo_with_its_critic_trains_in_each_precision(precision):
    # pure bf16 converts the critic's value head too: its input must follow the head's dtype (scripts/gpu_check.py's case)
    from workbench.tasks import rl_problems
    from workbench.trainers.ppo import PPOConfig, PPOTrainer

    model, tokenizer = checkpoints.load("tiny-arith-qwen2", device="cpu")
    config = PPOConfig(steps=1, progress=False, prompts_per_step=4, mini_batches=2, max_new_tokens=4, precision=precision)
    step = PPOTrainer(model, tokenizer, rl_problems(8), config).train()[0]
    assert step["train_ratio_deviation"] == 0.0 and step["kl_token_max_abs"] == 0.0
    assert torch.isfinite(torch.tensor(step["value_loss"]))


# ---- resuming safely ------------------------------------------------------------------------------
GRPO_ARGS = ["train", "grpo", "--quiet", "--limit", "16", "--prompts_per_step", "2", "--num_generations", "2", "--max_new_tokens", "4"]


def test_resume_under_another_config_is_refused_naming_the_fields(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(GRPO_ARGS + ["--output-dir", out, "--steps", "2"]) == 0
    assert main(GRPO_ARGS + ["--output-dir", out, "--steps", "3", "--loss_agg", "dapo"]) == 2
    err = capsys.readouterr().err
    assert "loss_agg: saved 'seq-mean-token-mean', now 'dapo'" in err and "--set loss_agg=seq-mean-token-mean" in err
    assert main(GRPO_ARGS + ["--output-dir", out, "--steps", "3"]) == 0  # more steps: allowed


def test_a_truncated_latest_checkpoint_falls_back_to_the_last_valid_one(tmp_path, capsys):
    from workbench.trainers.checkpointing import latest_checkpoint, latest_valid_checkpoint

    out = tmp_path / "run"
    assert main(GRPO_ARGS + ["--output-dir", str(out), "--steps", "2", "--checkpoint_every", "1"]) == 0
    latest = latest_checkpoint(out)
    weights = latest / "policy.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a crash mid-copy, a full disk…
    folder, skipped = latest_valid_checkpoint(out)
    assert folder.name == "step-000001" and skipped[0][0] == latest.name and "truncated" in skipped[0][1]
    capsys.readouterr()
    assert main(GRPO_ARGS + ["--output-dir", str(out), "--steps", "2", "--checkpoint_every", "1"]) == 0
    printed = capsys.readouterr().out
    assert "skipped" in printed and "resuming from step-000001" in printed


def test_no_valid_checkpoint_is_an_error_not_a_silent_restart(tmp_path, capsys):
    from workbench.trainers.checkpointing import CHECKPOINT_DIR

    out = tmp_path / "run"
    assert main(GRPO_ARGS + ["--output-dir", str(out), "--steps", "1"]) == 0
    for weights in (out / CHECKPOINT_DIR).glob("step-*/policy.safetensors"):
        weights.write_bytes(b"garbage")
    assert main(GRPO_ARGS + ["--output-dir", str(out), "--steps", "2"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
