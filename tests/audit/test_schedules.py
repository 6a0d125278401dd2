"""check_old_logprob_guard (P27): TRL 0.20's rule passes, TRL 0.19's misses the remainder settings, a trainer that never
snapshots misses every split setting, an always-snapshot rule passes with its extra forwards reported."""

import pytest

from workbench.audit import check_old_logprob_guard
from workbench.audit.schedules import batch_is_split
from workbench.core.errors import AuditSignatureError


def trl_019(spg, ga, iters):
    return iters > 1 or spg > ga


def trl_020(spg, ga, iters):
    return ga % (spg * iters) != 0


def test_split_settings_by_hand():
    assert batch_is_split(3, 4) and batch_is_split(8, 4) and batch_is_split(1, 4, 3)  # 4 micro-steps, batches of 3
    assert not batch_is_split(2, 4) and not batch_is_split(4, 4) and not batch_is_split(1, 4, 2)


def test_trl_020_passes_and_trl_019_misses_exactly_the_remainder_settings():
    good = check_old_logprob_guard(trl_020)
    assert good.passed and good.value == 0 and good.details["extra"] == [] and good.details["settings"] == 128
    old = check_old_logprob_guard(trl_019)
    assert not old.passed and "PR #3493" in old.convention
    assert old.details["missed"] == [[s, g, 1] for s in range(1, 9) for g in range(1, 9) if s < g and g % s]
    assert [3, 4, 1] in old.details["missed"] and old.value == 16
    assert old.details["extra"]  # num_iterations 2 with GA a multiple of 2·spg: snapshots that are not needed, not failures


def test_never_snapshotting_misses_every_split_setting_and_always_passes():
    never = check_old_logprob_guard(lambda s, g, i: False)
    assert not never.passed and never.value == sum(batch_is_split(s, g, i) for i in (1, 2) for s in range(1, 9) for g in range(1, 9))
    assert "PR #3493" not in never.convention  # spg > GA settings are missed too: not TRL 0.19's pattern
    always = check_old_logprob_guard(lambda s, g, i: True)
    assert always.passed and "extra forward" in always.convention and always.details["extra"]


def test_a_wrong_signature_is_named():
    with pytest.raises(AuditSignatureError, match="needs_old_logprobs"):
        check_old_logprob_guard(lambda spg, ga: True)
