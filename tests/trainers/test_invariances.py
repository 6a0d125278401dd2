"""The invariances the workbench teaches, checked on its own trainers.

* **Step 0** — before any optimiser step, under the default switches, for PPO, GRPO and DPO and
  every combination of mini-batches, iterations/epochs, packing, temperature and dtype, and for a
  checkpoint whose config carries dropout 0.1: ρ = 1 (exactly: π_old is recomputed by the same
  forward, in the same layout), KL to an identical reference 0, clip fraction 0, DPO margins 0.
* **After an update** — the later mini-batches of a batch see ρ ≠ 1, and clipping acts on them.
* **Padding** — extra left or right padding changes no per-token log-prob, loss or gradient beyond
  float noise (fp32 ≤ 1e-5), padded and packed, for the policy, the reference and the critic.
* **Batch composition** (fp32) — a sequence's log-probs do not depend on the other rows.
"""

import copy
import itertools

import pytest
import torch

from workbench.core import losses
from workbench.core.batching import pad_sequences
from workbench.experiments.checkpoints import load
from workbench.modeling.scoring import response_logprobs, token_logprobs
from workbench.modeling.tiny import tiny_model
from workbench.tasks import Problem, encode_prompts
from workbench.trainers.critic import ValueModel
from workbench.trainers.dpo import DPOConfig, DPOTrainer
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer, grpo_loss
from workbench.trainers.ppo import PPOConfig, PPOTrainer
from workbench.trainers.preferences import build_loss_mask, collate_preferences

pytestmark = pytest.mark.numeric  # held to AVX2 in .ci/run (docs/CPU_PORTABILITY.md)

# Prompts of different lengths, so left-padded batches really hold pads.
RAGGED = [Problem("1+2=", "3"), Problem("12+34=", "46"), Problem("3*4=", "12"), Problem("56-7=", "49"),
          Problem("9-99=", "-90"), Problem("7+8=", "15"), Problem("80-80=", "0"), Problem("2*2=", "4")]
PAIRS = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"}, {"prompt": "12+34=", "chosen": "46", "rejected": "406"},
         {"prompt": "3*4=", "chosen": "12", "rejected": "7"}, {"prompt": "56-7=", "chosen": "49", "rejected": "-1"}]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def policy(dtype="fp32", dropout=False):
    """The shipped trained policy, or (``dropout``) a GPT-2 config carrying dropout 0.1 like GPT-2's."""
    if dropout:
        model, tokenizer = tiny_model("gpt2", seed=1, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    else:
        model, tokenizer = load("tiny-arith-qwen2")
    return model.to(DTYPES[dtype]), tokenizer


# ---- step 0 ------------------------------------------------------------------------------------
def pairwise_cover(levels):
    """A subset of the full product in which every pair of values of every two factors appears
    (greedy, deterministic): 6 runs instead of 32 for five two-level factors."""
    full = list(itertools.product(*levels))
    pairs = lambda row: {(i, j, row[i], row[j]) for i in range(len(row)) for j in range(i + 1, len(row))}  # noqa: E731
    missing, chosen = set().union(*(pairs(r) for r in full)), []
    while missing:
        best = max(full, key=lambda r: len(pairs(r) & missing))
        chosen.append(best)
        missing -= pairs(best)
    return chosen


def grid(levels):
    """Pairwise cover in the default suite; the rest of the full product under ``-m slow``."""
    cover = pairwise_cover(levels)
    return cover + [pytest.param(*row, marks=pytest.mark.slow) for row in itertools.product(*levels) if row not in cover]


LEVELS = [(1, 2), (1, 2), (False, True), (1.0, 0.7), ("fp32", "bf16")]
GRPO_GRID = grid(LEVELS)


@pytest.mark.parametrize("mini_batches, iterations, packed, temperature, dtype", GRPO_GRID)
def test_grpo_step0_ratio_one_kl_zero_no_clipping(mini_batches, iterations, packed, temperature, dtype):
    model, tokenizer = policy(dtype)
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=4, num_generations=2, max_new_tokens=4, beta=0.1,
                        mini_batches=mini_batches, num_iterations=iterations, packed=packed, temperature=temperature)
    step = GRPOTrainer(model, tokenizer, RAGGED, config).train()[0]
    assert step["ratio_deviation_first"] == 0.0
    assert step["kl_first"] == 0.0
    assert step["clip_fraction_first"] == 0.0


@pytest.mark.parametrize("mini_batches, iterations, packed, temperature, dtype", GRPO_GRID)
def test_grpo_first_training_forward_is_exactly_a_separate_old_policy_forward(mini_batches, iterations, packed, temperature,
                                                                              dtype):
    # GRPO takes the first mini-batch's π_old from its own first training forward (detached) instead of a
    # separate no-grad forward: that is only the same algorithm if the two forwards agree bit for bit
    model, tokenizer = policy(dtype)
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=4, num_generations=2, max_new_tokens=4,
                        mini_batches=mini_batches, num_iterations=iterations, packed=packed, temperature=temperature)
    trainer = GRPOTrainer(model, tokenizer, RAGGED, config)
    _, rollout = trainer.sample_rollout(0, repeats=config.num_generations)
    layout = trainer.training_layout()
    separate = trainer.score_in_layout(trainer.policy, rollout, layout)
    first = layout[0]
    training, _ = trainer.logprobs(trainer.train_policy, rollout, first, with_entropy=True)
    mask = rollout.response_mask[first].bool()
    assert mask.sum() > 0 and training.requires_grad
    assert torch.equal(training.detach()[mask], separate[first][mask])


PPO_GRID = grid(LEVELS)


@pytest.mark.parametrize("mini_batches, epochs, packed, temperature, dtype", PPO_GRID)
def test_ppo_step0_ratio_one_kl_zero_no_clipping(mini_batches, epochs, packed, temperature, dtype):
    model, tokenizer = policy(dtype)
    config = PPOConfig(steps=1, progress=False, prompts_per_step=8, mini_batches=mini_batches, ppo_epochs=epochs,
                       packed=packed, temperature=temperature, max_new_tokens=4)
    step = PPOTrainer(model, tokenizer, RAGGED, config).train()[0]
    assert step["train_ratio_deviation"] == 0.0
    assert step["kl_token_max_abs"] == 0.0
    assert step["clip_fraction_first"] == 0.0


@pytest.mark.parametrize("packed, dtype", list(itertools.product((False, True), ("fp32", "bf16"))))
def test_dpo_step0_margins_are_zero(packed, dtype):
    model, tokenizer = policy(dtype)
    config = DPOConfig(steps=1, progress=False, batch_size=4, packed=packed)
    step = DPOTrainer(model, tokenizer, PAIRS, config).train()[0]
    assert step["rewards/margins"] == 0.0 and step["rewards/chosen"] == 0.0 and step["rewards/rejected"] == 0.0


def test_checkpoint_with_dropout_under_default_switches_is_exact_at_step0():
    model, tokenizer = policy(dropout=True)
    assert model.config.resid_pdrop == 0.1
    grpo = GRPOTrainer(copy.deepcopy(model), tokenizer, RAGGED, GRPOConfig(
        steps=1, progress=False, prompts_per_step=4, num_generations=2, max_new_tokens=4, beta=0.1, mini_batches=2)).train()[0]
    assert grpo["ratio_deviation_first"] == 0.0 and grpo["kl_first"] == 0.0
    ppo = PPOTrainer(copy.deepcopy(model), tokenizer, RAGGED, PPOConfig(
        steps=1, progress=False, prompts_per_step=8, mini_batches=2, max_new_tokens=4)).train()[0]
    assert ppo["train_ratio_deviation"] == 0.0 and ppo["kl_token_max_abs"] == 0.0
    assert ppo["first_ratio_deviation"] < 1e-5  # sampler vs training forward: float noise only
    dpo = DPOTrainer(copy.deepcopy(model), tokenizer, PAIRS, DPOConfig(steps=1, progress=False, batch_size=4)).train()[0]
    assert dpo["rewards/margins"] == 0.0


def test_dpo_dropout_switch_reproduces_noisy_step0_margins():
    model, tokenizer = policy(dropout=True)
    bug = DPOTrainer(model, tokenizer, PAIRS, DPOConfig(steps=1, progress=False, batch_size=4, disable_dropout=False)).train()[0]
    assert abs(bug["rewards/margins"]) > 1e-4


# ---- after an update ---------------------------------------------------------------------------
def test_grpo_second_mini_batch_sees_the_update_and_clips():
    # settings where one update visibly moves the second mini-batch's ratio: 4 prompts, two mini-batches, ε = 1e-4, lr 1e-2
    model, tokenizer = policy()
    config = GRPOConfig(steps=1, progress=False, prompts_per_step=4, num_generations=4, mini_batches=2, clip_low=1e-4,
                        clip_high=1e-4, learning_rate=1e-2, max_new_tokens=4, scale_rewards="none")
    trainer = GRPOTrainer(model, tokenizer, RAGGED, config)
    trainer.problems = [Problem("12+34=", "46")] * 2 + [Problem("3*4=", "12")] * 2  # some groups with reward spread
    step = trainer.train()[0]
    assert step["ratio_deviation_first"] == 0.0
    assert step["ratio_deviation_later"] > 1e-3
    assert step["clip_fraction"] > 0.0


def test_grpo_single_step_batch_keeps_rho_identically_one():
    model, tokenizer = policy()
    step = GRPOTrainer(model, tokenizer, RAGGED, GRPOConfig(steps=1, progress=False, prompts_per_step=4, num_generations=2,
                                                            max_new_tokens=4)).train()[0]
    assert step["ratio_deviation_first"] == 0.0 and step["clip_fraction"] == 0.0
    assert step["ratio_deviation_later"] != step["ratio_deviation_later"]  # NaN: there is no later step


def test_ppo_later_mini_batches_see_the_update():
    model, tokenizer = policy()
    step = PPOTrainer(model, tokenizer, RAGGED, PPOConfig(steps=1, progress=False, prompts_per_step=8, mini_batches=2,
                                                          learning_rate=1e-2, max_new_tokens=4)).train()[0]
    assert step["train_ratio_deviation"] == 0.0 and step["ratio_deviation_later"] > 1e-3


# ---- padding and batch composition --------------------------------------------------------------
def ragged_rollout(tokenizer, extra_left=0, extra_right=0):
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [p.prompt for p in RAGGED[:4]])
    answers = [tokenizer(p.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for p in RAGGED[:4]]
    response_ids, response_mask = pad_sequences(answers, tokenizer.pad_token_id, side="right")
    pad = tokenizer.pad_token_id
    prompt_ids = torch.cat([torch.full((4, extra_left), pad), prompt_ids], 1)
    prompt_mask = torch.cat([torch.zeros(4, extra_left, dtype=torch.long), prompt_mask], 1)
    response_ids = torch.cat([response_ids, torch.full((4, extra_right), pad)], 1)
    response_mask = torch.cat([response_mask, torch.zeros(4, extra_right, dtype=torch.long)], 1)
    return prompt_ids, prompt_mask, response_ids, response_mask


def real(values, mask):
    """The values at real positions, in order (the padding-free view)."""
    return values[mask.bool()]


@pytest.mark.parametrize("arch, packed", list(itertools.product(("tiny-arith-qwen2", "tiny-arith-gpt2"), (False, True))))
def test_extra_padding_changes_no_logprob_loss_or_gradient(arch, packed):
    model, tokenizer = load(arch)
    results = []
    for extra_left, extra_right in ((0, 0), (3, 0), (0, 5), (2, 4)):
        p_ids, p_mask, r_ids, r_mask = ragged_rollout(tokenizer, extra_left, extra_right)
        model.zero_grad(set_to_none=True)
        logp = response_logprobs(model, p_ids, p_mask, r_ids, r_mask, packed=packed)
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        loss, _ = grpo_loss(logp, logp.detach() - 0.01, advantages, r_mask.float(), loss_agg="seq-mean-token-mean")
        ppo_loss, _ = losses.ppo_policy_loss(logp, logp.detach() - 0.01, advantages[:, None].expand_as(logp), r_mask.float())
        (loss + ppo_loss).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        results.append((real(logp.detach(), r_mask), float(loss.detach()), float(ppo_loss.detach()), grads))
    base = results[0]
    for other in results[1:]:
        torch.testing.assert_close(other[0], base[0], atol=1e-5, rtol=0)
        assert abs(other[1] - base[1]) <= 1e-5 and abs(other[2] - base[2]) <= 1e-5
        torch.testing.assert_close(other[3], base[3], atol=1e-5, rtol=0)


@pytest.mark.parametrize("packed", (False, True))
def test_extra_padding_changes_no_critic_value(packed):
    model, tokenizer = load("tiny-arith-gpt2")
    critic = ValueModel.from_policy(model)
    values = []
    for extra_left, extra_right in ((0, 0), (3, 2)):
        p_ids, p_mask, r_ids, r_mask = ragged_rollout(tokenizer, extra_left, extra_right)
        with torch.no_grad():
            values.append(real(critic.response_values(p_ids, p_mask, r_ids, r_mask, packed=packed), r_mask))
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("packed", (False, True))
def test_dpo_summed_logprobs_ignore_extra_right_padding(packed):
    from workbench.trainers.preferences import summed_logprobs

    model, tokenizer = load("tiny-arith-gpt2")
    batch = collate_preferences(tokenizer, PAIRS)
    wider = copy.copy(batch)
    wider.input_ids = torch.cat([batch.input_ids, torch.full((8, 3), tokenizer.pad_token_id)], 1)
    wider.attention_mask = torch.cat([batch.attention_mask, torch.zeros(8, 3, dtype=torch.long)], 1)
    with torch.no_grad():
        narrow_sums, _ = summed_logprobs(model, batch, build_loss_mask(batch.attention_mask, batch.prompt_lengths, "both"), packed=packed)
        wide_sums, _ = summed_logprobs(model, wider, build_loss_mask(wider.attention_mask, wider.prompt_lengths, "both"), packed=packed)
    torch.testing.assert_close(wide_sums, narrow_sums, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ("tiny-arith-qwen2", "tiny-arith-gpt2"))
def test_a_sequence_logprobs_do_not_depend_on_the_other_rows(arch):
    model, tokenizer = load(arch)
    rows = [tokenizer(p.prompt + p.answer)["input_ids"] for p in RAGGED]
    alone = []
    for row in rows:
        ids, mask = pad_sequences([row], tokenizer.pad_token_id, side="left")
        alone.append(token_logprobs(model, ids, mask)[0])
    for side in ("left", "right"):
        ids, mask = pad_sequences(rows, tokenizer.pad_token_id, side=side)
        together = token_logprobs(model, ids, mask)
        targets = (mask[:, 1:] & mask[:, :-1]).bool()
        for i in range(len(rows)):
            torch.testing.assert_close(together[i][targets[i]], alone[i], atol=1e-5, rtol=0)
