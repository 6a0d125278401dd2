"""What each watch mode observes, as docs/WATCH.md states it: P12 (a rollout sampled by a copy in another dtype) is
flagged in light mode from what the workbench's sampler announces; deep mode adds the re-scoring forward, whose
evidence is the sampler's log-probs against the training model's on the same tokens."""

import pytest
from test_watcher import SWITCHES, watched_step


@pytest.mark.slow  # a PPO step with the deep watch: ~7 s of CPU
def test_p12_deep_mode_adds_the_rescoring_evidence_to_the_light_finding():
    kind, name, bug, shared, deep = SWITCHES["P12"]
    assert deep is False  # the light-mode finding: tests/watch/test_watcher.py::test_switch_on_is_flagged_with_its_id[P12]
    finding = next(f for f in watched_step(kind, name, {**shared, **bug}, deep=True).findings if f.pitfall == "P12")
    assert finding.evidence["sampler_dtype"] == "bfloat16" and finding.evidence["policy_dtype"] == "float32"
    assert finding.evidence["tokens"] > 0 and 0 < finding.evidence["mean_abs_delta_logp"] <= finding.evidence["max_abs_delta_logp"]
