"""Diagnostics: one module per pitfall, each a set of pure measurements a notebook plots and a
user can run against their own model or batch. Each pitfall module also holds the notebook's
sweeps, its figures (functions taking an ``ax``, used by the widgets too) and its
``verdict(...) -> (reproduced, fixed)``, a function of measured numbers (tests/test_verdicts.py).

* ``position_ids`` — S1: log-prob drift of padded vs unpadded copies of the same text.
* ``padding`` — S2: right-padding guard, cached-generation divergence, packed-scoring throughput.
* ``eos`` — S3 and P8: generation cost with and without EOS stopping; EOS dropped by pad masks.
* ``dpo_mask`` — S4: loss-mask audit, prompt-length check, margin decomposition.
* ``loss_normalization`` — S5: zero-loss probe, per-token weights, effective β.
* ``temperature`` (P6), ``dropout`` (P7), ``pad_eos`` (P8), ``kl_estimators`` (P9),
  ``grad_accumulation`` (P10), ``truncation`` (P11: the step-0 push of the loss towards truncated
  responses; the switches live in the GRPO trainer), ``rollout_mismatch`` (P12), ``whitening`` (P13).
"""
