"""The course's exercises, in course order: each one's name, the lesson notebook it follows, the function the learner
writes (its signature) and what that function computes, in one table.

One table, so that the order, the lessons and the signatures of the course read in one place and no exercise module
repeats the declaration's form. Each exercise module ``workbench/exercises/<name>.py`` takes its ``Exercise`` from
here (``EXERCISE = COURSE[name]``) and adds its cases to it (``@EXERCISE.add_case``); ``registry`` imports them all.
``needs_model``: the cases use the tiny GPT-2 (built once before the first case is timed).
"""

from __future__ import annotations

from workbench.exercises.common import Exercise

COURSE: dict[str, Exercise] = {exercise.name: exercise for exercise in (
    Exercise("s1_position_ids", lesson="01_position_ids", needs_model=True,
             signature="position_ids(attention_mask: Tensor[B, T]) -> LongTensor[B, T]",
             summary="position ids that follow the attention mask: the first real token of every row at 0"),
    Exercise("s2_left_pad", lesson="02_right_padding_flash_attention", needs_model=True,
             signature="left_pad(input_ids: LongTensor[B, T], attention_mask: Tensor[B, T], pad_id: int) -> (input_ids, attention_mask)",
             summary="right padding turned into left padding: every row's real tokens end in the last column"),
    Exercise("s3_mask_after_eos", lesson="03_eos_termination",
             signature="mask_after_eos(response_ids: LongTensor[B, R], stop_ids: list[int]) -> Tensor[B, R]",
             summary="the loss mask of sampled responses: 1 up to and including the first stop id, 0 after"),
    Exercise("s3_generate", lesson="03_eos_termination", needs_model=True,
             signature=("generate(model, input_ids: LongTensor[B, T], attention_mask: Tensor[B, T], max_new_tokens: int, "
                        "stop_ids: list[int]) -> LongTensor[B, T+R]"),
             summary="a batched greedy decoding loop that stops when every row has produced a stop id"),
    Exercise("s4_dpo_logps", lesson="04_dpo_loss_mask",
             signature=("dpo_logps(token_logps: Tensor[2B, T-1], attention_mask: Tensor[2B, T], prompt_lengths: list[int] (B)) "
                        "-> Tensor[2B]"),
             summary="DPO's sequence log-probs: the sum of each row's response-token log-probs, prompts masked on both halves"),
    Exercise("s5_grpo_loss", lesson="05_grpo_loss_normalization",
             signature="grpo_loss(per_token_loss: Tensor[B, T], mask: Tensor[B, T]) -> Tensor[]",
             summary="the GRPO paper's loss: mean over each response's real tokens, then mean over responses"),
    Exercise("p6_logprobs", lesson="06_temperature", needs_model=True,
             signature="logprobs(logits: Tensor[B, T, V], ids: LongTensor[B, T], temperature: float) -> Tensor[B, T]",
             summary="the log-probs of the sampling distribution softmax(logits / τ), computed in float32"),
    Exercise("p9_k3", lesson="09_kl_estimators",
             signature="k3(logp: Tensor[B, T], ref_logp: Tensor[B, T]) -> Tensor[B, T]",
             summary="the k3 KL estimator per token: exp(r) − r − 1 with r = ref_logp − logp"),
    Exercise("p13_whiten", lesson="13_whitening",
             signature="whiten(values: Tensor[B, T], mask: Tensor[B, T]) -> Tensor[B, T]",
             summary="advantage whitening with the mean and variance of the real tokens of the batch"),
)}
