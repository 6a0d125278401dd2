"""Peer lab verdicts (pure functions, fed bug-present and bug-absent numbers) and, where the peer
environments exist, the released peers themselves (skipped with the reason otherwise).

The peer tests reuse the result ``make peers`` stored when the environment, the adapter and audit code
and the arguments are unchanged (``lab.run_lab(reuse=True)``), so they are fast after ``make peers``.
"""

import pytest

from workbench.peers import envs, lab
from workbench.peers import expectations as peer_lab


def eos(generated, needed, budget=32):
    return {"tokens_generated_per_row": generated, "longest_needed": needed, "max_new_tokens": budget,
            "wasted_tokens": 4 * (generated - needed)}


def row(peer, version, probe, measured, audit=None):
    return peer_lab.judge(peer, version, {"probe": probe, "measured": measured, "audit": audit})


def test_s3_rows_judge_both_ways():
    assert row("trl", "0.11.4", "s3_eos_stopping", eos(32, 3))["verdict"] == peer_lab.AS_EXPECTED
    assert row("trl", "0.11.4", "s3_eos_stopping", eos(3, 3))["verdict"] == peer_lab.DIFFERS  # bug absent
    assert row("trl", "1.16.0", "s3_eos_stopping", eos(3, 3))["verdict"] == peer_lab.AS_EXPECTED
    assert row("trl", "1.16.0", "s3_eos_stopping", eos(32, 3))["verdict"] == peer_lab.DIFFERS


def test_s5_zero_loss_rows_judge_both_ways():
    probe = {"lengths": [2, 3, 5, 8]}
    assert row("trl", "0.16.1", "s5_zero_loss", {**probe, "loss": 0.278})["verdict"] == peer_lab.AS_EXPECTED
    assert row("trl", "0.16.1", "s5_zero_loss", {**probe, "loss": 1e-9})["verdict"] == peer_lab.DIFFERS
    assert row("trl", "0.15.2", "s5_zero_loss", {**probe, "loss": -7e-9})["verdict"] == peer_lab.AS_EXPECTED
    assert row("trl", "0.15.2", "s5_zero_loss", {**probe, "loss": 0.278})["verdict"] == peer_lab.DIFFERS


def test_s2_rows_judge_both_ways():
    raised = {"raised": True, "message": "You are attempting to perform batched generation with padding_side='right'",
              "padding_side": "right"}
    clean = {"raised": False, "message": "", "padding_side": "right", "max_abs_logit_gap_vs_eager": 2e-7}
    assert row("transformers", "4.41.2", "s2_flash_right_padding", raised)["verdict"] == peer_lab.AS_EXPECTED
    assert row("transformers", "4.41.2", "s2_flash_right_padding", clean)["verdict"] == peer_lab.DIFFERS
    assert row("transformers", "4.42.4", "s2_flash_right_padding", clean)["verdict"] == peer_lab.AS_EXPECTED
    assert row("transformers", "4.42.4", "s2_flash_right_padding", raised)["verdict"] == peer_lab.DIFFERS
    wrong = {**clean, "max_abs_logit_gap_vs_eager": 0.3}  # the forward ran but the stand-in kernels were not exact
    assert row("transformers", "4.42.4", "s2_flash_right_padding", wrong)["verdict"] == peer_lab.DIFFERS


def test_verdict_needs_every_bug_and_fix_row_measured():
    bug = {"role": "bug", "verdict": peer_lab.AS_EXPECTED}
    fix = {"role": "fix", "verdict": peer_lab.AS_EXPECTED}
    assert peer_lab.verdict([bug, fix]) == (True, True)
    assert peer_lab.verdict([{**bug, "verdict": peer_lab.DIFFERS}, fix]) == (False, True)
    assert peer_lab.verdict([bug, {**fix, "verdict": peer_lab.SKIPPED}]) == (True, False)  # skipped is never a verdict
    assert peer_lab.verdict([]) == (False, False)


def test_a_skipped_peer_keeps_its_planned_rows_with_the_reason(tmp_path):
    rows, payloads = lab.run_lab(only=["verl-0.9.1"], root=tmp_path)
    assert payloads["verl-0.9.1"]["status"] == "skipped"
    assert [r["verdict"] for r in rows] == [peer_lab.SKIPPED] * 4
    assert all("does not exist" in r["measured"] for r in rows)
    assert peer_lab.skipped_reason(rows) == ""  # verl rows are conventions, not bug/fix rows
    rows, _ = lab.run_lab(only=["trl-0.16.1"], root=tmp_path)
    assert "make peers" in peer_lab.skipped_reason(rows)


def test_cache_key_changes_with_the_arguments_and_needs_an_environment(tmp_path):
    run = next(r for r in lab.plan() if r.key == "trl-1.16")
    other = lab.Run(**{**run.__dict__, "args": {**run.args, "loss_types": ["grpo"]}})
    assert lab.cache_key(run) != lab.cache_key(other)
    assert lab.cache_key(next(r for r in lab.plan() if r.key == "verl-0.9.1"), tmp_path) is None


def test_table_columns_are_peer_version_probe_expected_measured_verdict():
    rows = [row("trl", "0.16.1", "s5_zero_loss", {"lengths": [1, 2], "loss": 0.5})]
    header = peer_lab.table(rows).splitlines()[0]
    assert header == "| peer | version | probe | expected | measured | verdict |"


def _run_or_skip(key):
    run = next(r for r in lab.plan() if r.key == key)
    if run.env != "host":
        status = envs.locate(envs.get_spec(run.env))
        if not status.ready:
            pytest.skip(status.reason)
    rows, payloads = lab.run_lab(only=[key], reuse=True)
    payload = payloads[key]
    if payload["status"] == "skipped":
        pytest.skip(payload["reason"])
    assert payload["status"] == "ok", payload.get("reason")
    return {r["probe"]: r for r in rows}, payload


@pytest.mark.parametrize("key", ["trl-0.11.4", "trl-0.16.1", "transformers-4.41.2"])
def test_buggy_release_shows_its_bug(key):
    rows, _ = _run_or_skip(key)
    bug_rows = [r for r in rows.values() if r["role"] == "bug"]
    assert bug_rows and all(r["verdict"] == peer_lab.AS_EXPECTED for r in bug_rows), bug_rows


@pytest.mark.parametrize("key", ["trl-0.15.2", "transformers-4.42.4", "openrlhf-0.11.2"])
def test_fixed_release_is_clean(key):
    rows, payload = _run_or_skip(key)
    fix_rows = [r for r in rows.values() if r["role"] == "fix"]
    assert fix_rows and all(r["verdict"] == peer_lab.AS_EXPECTED for r in fix_rows), fix_rows
    if key.startswith(("openrlhf", "transformers")):  # flash_attn comes from the labelled stand-in
        assert "flash_attn" in payload["environment"]["standins"]


@pytest.mark.parametrize("key", ["verl-0.9.1", "openrlhf-0.11.2"])
def test_documented_conventions(key):
    rows, _ = _run_or_skip(key)
    differing = [r for r in rows.values() if r["role"] == "convention" and r["verdict"] != peer_lab.AS_EXPECTED]
    assert not differing, differing


def test_peer_lab_s5_panel_draws_one_probe_coloured_by_convention():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.viz import plots

    def row(probe, mode, value, loss_type=None, norm=None):
        details = {"mode": mode, "value": value, **({"norm_constant": norm} if norm else {})}
        return {"probe": probe, "measured": {"loss_type": loss_type}, "audit": {"details": details}}

    payloads = {"trl-0.15.2": {"rows": [row("s5_zero_loss", "", 0.0), row("aggregation", "seq-mean-token-mean", 0.0)]},
                "trl-0.16.1": {"rows": [row("s5_zero_loss", "", 0.278), row("aggregation", "token-mean", 0.3824)]},
                "trl-1.16": {"rows": [row("aggregation", "token-mean", 0.3824, "dapo"),
                                      row("aggregation", "seq-mean-token-sum-norm", 0.2031, "dr_grpo", 32.0)]}}
    bars = peer_lab.s5_bars(payloads)
    assert [b["value"] for b in bars] == [0.0, 0.3824, 0.3824, 0.2031]  # the s5_zero_loss rows are not mixed in
    fig, ax = plt.subplots()
    peer_lab.plot_s5(ax, payloads)
    colors = [p.get_facecolor() for p in ax.patches]
    assert colors[1] == colors[2] != colors[3]  # 0.16.1 and 1.16 dapo: same convention, same colour
    assert matplotlib.colors.to_rgba(plots.BUG_COLOR) not in colors
    assert any("C = B × 8" in t.get_text() for t in ax.texts)
    plt.close(fig)
