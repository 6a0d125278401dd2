"""Pitfalls: one module per notebook, named like it (``nb12_logprob_mismatch`` ↔ ``notebooks/12_logprob_mismatch.ipynb``).

A notebook is parameters, calls and plots of its module (tests/integration/test_notebooks.py checks it); each module holds,
from the top, each section under a banner line ``# ---- <section> ----`` (tests/pitfalls/test_module_sections.py checks
the order):

* measurements — pure functions a user can also run against their own model or batch;
* sweeps — the measurements over the notebook's parameters (pad widths, micro-batch sizes, seeds, variants), training
  runs and the effects measured from them (``ppo_effects``, ``training_effects``, …), and the headline the report
  shows (``headline_row``, ``headline_rows``), chosen once here;
* verdict — ``verdict(...) -> (reproduced, fixed)``, a function of measured numbers (tests/pitfalls/test_nb*.py);
  where a checkpoint may be unable to show the pitfall, ``not_shown(...)`` saying why; in a training notebook
  ``PREDICTION`` (a ``workbench.experiments.statistics.Prediction``);
* figures — ``plot_*(ax, …)`` functions that draw on a given ``ax`` (or axes), and ``figure_*(…) -> Figure`` that
  lay them out as the notebook shows them (the notebook saves the figure and calls ``plt.show()``);
* printers — ``*_line``, ``*_lines``, ``*_sentence`` and ``*_note``: the text the notebook prints;
* explorer — ``*_explorer(…) -> workbench.viz.explorer.Explorer``, named for what it explores, shown under
  ``if interactive:``;
* metrics — ``metrics(…) -> dict``, ``notebook_api.write_metrics``'s keyword arguments, so that a notebook's last cell
  is ``notebook_api.write_metrics(out, **pitfall.metrics(…))``.

A number is computed once, in a measurement or a sweep, and the figures, printers and ``metrics`` take it as an argument.

Pitfall modules never import each other (an import-linter contract in pyproject.toml); a notebook may import several.

* ``nb00_quickstart`` — notebook 00: padding, attention masks and position ids on one model (it also shows
  ``nb01_position_ids``' drift per text and its explorer).
* ``nb01_position_ids`` — S1: left padding without explicit position ids.
* ``nb02_right_padding_flash_attention`` — S2: right padding, Qwen2 + flash-attention, and padding-free batches.
* ``nb03_eos_termination`` — S3: rollouts that do not stop at EOS (and P8: pad token = EOS token).
* ``nb04_dpo_loss_mask`` — S4: the DPO loss mask that covered only the chosen prompts.
* ``nb05_grpo_loss_normalization`` — S5: how a GRPO loss is normalised over tokens and sequences.
* ``nb06_temperature`` — P6: sampling at temperature τ, recomputing log-probs at τ = 1.
* ``nb07_dropout`` — P7: dropout left on in the policy and the reference during RL.
* ``nb08_pad_equals_eos`` — P8: pad token = EOS token.
* ``nb09_kl_estimators`` — P9: which KL estimator, and where it goes (reward or loss).
* ``nb10_grad_accumulation`` — P10: gradient accumulation with a token-mean loss.
* ``nb11_truncated_responses`` — P11: truncated responses (no EOS) scored as if finished.
* ``nb12_logprob_mismatch`` — P12: the rollout engine and the trainer disagree on log-probs.
* ``nb13_whitening`` — P13: whitening advantages or rewards over padded positions.
* ``nb14_truncated_sampling`` — P14: sampling with top-p/top-k, scoring with the full softmax.
* ``nb15_temperature_entropy`` — P15: entropy and KL measured at a temperature other than the sampling one.
* ``nb16_group_statistics`` — P16: group statistics — a one-pass std in finite precision, and groups found by a fixed stride.
* ``nb17_stop_tokens`` — P17: which token ends a response — three sources that can disagree.
* ``nb18_padding_metrics`` — P18: logged metrics averaged over padding, or with a sentinel log-prob.
* ``nb19_batch_shape_logprobs`` — P19: in bf16 a sequence's log-probs depend on the batch it is scored in.
* ``nb20_kl_gradient`` — P20: the gradient of a KL *estimate* is not the gradient of the KL.
* ``nb21_duplicate_bos`` — P21: two BOS tokens — a chat template that writes BOS, and a tokenizer that adds one.
* ``nb22_multiturn_retokenization`` — P22: decode → re-encode between turns is not the identity for BPE.
* ``nb23_bf16_updates`` — P23: pure-bf16 updates are rounded away.
* ``nb24_reward_model_pooling`` — P24: a reward model that pools the hidden state of the wrong token.
* ``nb25_reward_on_first_pad`` — P25: PPO puts the sequence score on the first PAD after the EOS instead of on the EOS.
* ``nb26_gspo_length_weighting`` — P26: GSPO's sequence ratio broadcast over tokens, then summed — long samples weigh more.
* ``nb27_off_policy_remainder`` — P27: the off-policy remainder of a generation batch trained with ρ ≡ 1.
* ``nb28_async_staleness`` — P28: asynchronous staleness — behaviour log-probs recomputed by the current actor.
* ``nb29_stale_kv_cache`` — P29: a prefix (KV) cache reused across a weight update.
* ``nb30_moe_router_mismatch`` — P30: a mixture-of-experts router that picks other experts in rollout and training.
* ``nb31_logit_softcapping`` — P31: final-logit soft-capping wrong or missing in the RL log-prob path.
* ``nb32_same_seed_every_rank`` — P32: the same sampling seed on every rank — a group split over processes holds copies.
* ``nb33_rank_local_normalisation`` — P33: token normalisation per rank, and clipping by a shard's local norm.
* ``nb34_packing_boundaries`` — P34: packed sequences attending across their boundaries.
* ``nb35_multiturn_tool_tokens`` — P35: tool tokens inside a multi-turn response break reward-to-go and lengths.
* ``nb36_rollout_correction`` — P36: rollout–training gaps and their corrections, measured as gradient estimators.
* ``nb91_audit_your_trainer`` — not a pitfall: what notebook 91 shows of a ``workbench.audit`` run (figures, explorer,
  metrics); notebook 90's figures, explorer and metrics live with the peer lab, in ``workbench.peers.expectations``.
* ``nb92_watch_a_training_run`` — not a pitfall: what notebook 92 shows of a ``workbench.watch`` run.
* ``nb93_inspect_a_run`` — not a pitfall: rollout dumps of GRPO runs with planted faults, read by ``workbench.inspect``.
* ``nb94_engine_lab`` — notebook 94: vLLM's CPU build in the loop, four pitfalls of its defaults measured in the engine.
"""
