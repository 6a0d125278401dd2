"""``workbench.watch`` inside the released trainers, without any adapter (the peer lab's check of the watch): TRL 0.11.4's
``PPOv2Trainer`` (its own environment, ``make peers``) flagged S3 with its wasted decoding forwards — also with
``stop_token="eos"``, which only truncates afterwards — and TRL 1.16's ``GRPOTrainer`` (the project's environment)
not flagged, on a rollout that did stop early. The watch's count of wasted forwards equals the one ``trl_eos``
measures by wrapping ``generate`` (decoding steps − the tokens the longest response needed).

The runs reuse the results ``make peers`` stored when the environment and the code are unchanged."""

import pytest

from workbench.peers import envs, lab
from workbench.peers import expectations as peer_lab


def watched(findings, wasted, decode, budget=32):
    return {"s3_findings": findings, "wasted_decode_forwards": wasted, "decode_forwards": decode, "max_new_tokens": budget}


def verdict(version, probe, measured):
    return peer_lab.judge("trl", version, {"probe": probe, "measured": measured, "audit": None})["verdict"]


def test_s3_watch_rows_judge_both_ways():
    assert verdict("0.11.4", "s3_watch", watched(1, 29, 31)) == peer_lab.AS_EXPECTED
    assert verdict("0.11.4", "s3_watch", watched(0, 0, 2)) == peer_lab.DIFFERS  # bug not seen
    assert verdict("1.16.0", "s3_watch", watched(0, 0, 2)) == peer_lab.AS_EXPECTED
    assert verdict("1.16.0", "s3_watch", watched(1, 29, 31)) == peer_lab.DIFFERS
    assert verdict("1.16.0", "s3_watch", watched(0, 0, 31)) == peer_lab.DIFFERS  # never stopped early: nothing was judged


def run_or_skip(key):
    run = next(r for r in lab.plan() if r.key == key)
    if run.env != "host":
        status = envs.locate(envs.get_spec(run.env))
        if not status.ready:
            pytest.skip(status.reason)  # names `make peers`
    else:
        pytest.importorskip("trl")
    rows, payloads = lab.run_lab(only=[key], reuse=True)
    payload = payloads[key]
    if payload["status"] == "skipped":
        pytest.skip(payload["reason"])
    assert payload["status"] == "ok", payload.get("reason")
    return {r["probe"]: r for r in rows}, {r["probe"]: r["measured"] for r in payload["rows"]}


def s3_findings(measured):
    return [f for f in measured["report"]["findings"] if f["pitfall"] == "S3"]


def test_trl_0_11_4_ppov2_watched_flags_s3_with_its_wasted_forwards():
    rows, measured = run_or_skip("trl-0.11.4-watch")
    assert rows["s3_watch"]["verdict"] == peer_lab.AS_EXPECTED, rows["s3_watch"]
    bug = measured["s3_watch"]
    (finding,) = s3_findings(bug)
    assert finding["severity"] == "error" and finding["where"].startswith("trl/trainer/")  # the call site inside TRL
    assert 0 < finding["evidence"]["wasted_decode_forwards"] == bug["wasted_decode_forwards"] < bug["decode_forwards"]
    assert bug["decode_forwards"] == bug["max_new_tokens"] - 1  # decoded to response_length
    same_batch = run_or_skip("trl-0.11.4")[1]["s3_eos_stopping"]  # trl_eos: generate wrapped, responses kept
    assert bug["wasted_decode_forwards"] == same_batch["tokens_generated_per_row"] - same_batch["longest_needed"]
    truncated = measured["s3_watch_stop_token"]  # stop_token="eos" in 0.11.4: truncation after generating, same forwards
    assert truncated["s3_findings"] == 1 and truncated["wasted_decode_forwards"] == bug["wasted_decode_forwards"]


def test_trl_1_16_grpo_watched_has_no_s3():
    rows, measured = run_or_skip("trl-1.16-watch")
    fix = measured["s3_watch"]
    assert rows["s3_watch"]["verdict"] == peer_lab.AS_EXPECTED, rows["s3_watch"]
    assert not s3_findings(fix) and fix["wasted_decode_forwards"] == 0
    assert fix["generate_calls"] == 1 and 0 < fix["decode_forwards"] < fix["max_new_tokens"] - 1  # it stopped at EOS
