"""Peer lab: what each probe of a released peer is expected to show, the verdict, and the figures.

The adapters (``workbench.peers.adapters``) return measurements; this module turns each into a table
row ``{peer, version, probe, expected, measured, verdict, role, seed}``. ``role`` says what a row is
evidence of: ``bug`` (a release that shipped a seed's bug must show it), ``fix`` (a release with the
fix must not), ``convention`` (a documented convention of a current release). ``verdict`` is
``as expected`` / ``differs`` for a measured row, ``skipped`` (environment or import missing, with the
reason) or ``error`` — a skipped peer is never counted as a verdict.

``verdict(rows) -> (reproduced, fixed)``: reproduced when every bug row was measured and shows its
bug, fixed when every fix row was measured and is clean.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt

from workbench.audit import AuditResult
from workbench.audit.aggregation import PROBE_LENGTHS
from workbench.viz import plots
from workbench.viz.explorer import Explorer

AS_EXPECTED, DIFFERS, SKIPPED, ERROR = "as expected", "differs", "skipped", "error"
ZERO_TOL = 1e-6


@dataclass(frozen=True)
class Expectation:
    seed: str
    role: str
    expected: str
    test: object  # measured dict, audit dict | None -> bool
    describe: object  # measured dict, audit dict | None -> str


def _mode(measured, audit):
    return (audit or {}).get("details", {}).get("mode", measured.get("mode", "?"))


def _eos_text(m, a):
    return (f"{m['tokens_generated_per_row']} decoding steps for responses needing ≤ {m['longest_needed']} "
            f"(max_new_tokens {m['max_new_tokens']}, {m['wasted_tokens']} tokens past EOS)")


def _watch_s3(flagged: bool):
    """The watch's own S3 verdict on a release's trainer: flagged with wasted decoding forwards, or clean on a
    rollout that did stop early (fewer decoding forwards than max_new_tokens − 1, so there was EOS to judge)."""
    def test(m, a):
        if flagged:
            return m["s3_findings"] > 0 and m["wasted_decode_forwards"] > 0
        return m["s3_findings"] == 0 and m["wasted_decode_forwards"] == 0 and 0 < m["decode_forwards"] < m["max_new_tokens"] - 1
    return test


def _watch_text(m, a):
    return (f"watch: {m['s3_findings']} S3 finding(s), {m['wasted_decode_forwards']} of {m['decode_forwards']} decoding "
            f"forwards after every row's EOS (max_new_tokens {m['max_new_tokens']})")


def _agg(mode, constant=None):
    def test(m, a):
        if _mode(m, a) != mode:
            return False
        if constant is not None:
            return constant in str((a or {}).get("details", {}).get("norm_constant_scaling", ""))
        return True

    def describe(m, a):
        d = (a or {}).get("details", {})
        extra = f", C = {d['norm_constant_scaling']}" if d.get("norm_constant_scaling") else ""
        return f"{_mode(m, a)}{extra}; zero-mean group loss {float(d.get('value', float('nan'))):.4g}"
    return test, describe


def _zero_loss(zero: bool):
    def test(m, a):
        return abs(m["loss"]) < ZERO_TOL if zero else abs(m["loss"]) > 1e-3
    return test, lambda m, a: f"loss = {m['loss']:.3g} (β = 0, ratio 1, lengths {m['lengths']})"


def _flash(raises: bool):
    def test(m, a):
        ok = m["raised"] == raises
        if not raises and m.get("max_abs_logit_gap_vs_eager") is not None:
            ok = ok and m["max_abs_logit_gap_vs_eager"] < 1e-4
        return ok

    def describe(m, a):
        if m["raised"]:
            return f"ValueError: {m['message'][:70]}…"
        gap = m.get("max_abs_logit_gap_vs_eager")
        return "no error" + (f"; logits vs eager max |Δ| {gap:.1e} (stand-in kernels)" if gap is not None else "")
    return test, describe


def _audit_passed(m, a):
    return bool(a and a["passed"])


def _audit_text(m, a):
    if not a:
        return "?"
    d = a["details"]
    value = d.get("value")
    number = f" · {d.get('metric', '')} = {value:.3g}" if isinstance(value, (int, float)) else ""
    return f"{a['convention']}{number}"


def _kl_verl(m, a):
    k = m["kinds"]
    return (k["k1"]["formula"] == "k1" and not k["k1"]["clamped"] and k["k2"]["formula"] == "k2" and not k["k2"]["clamped"]
            and k["low_var_kl"]["formula"] == "k3" and k["low_var_kl"]["clamped"] and abs(k["low_var_kl"]["max"] - 10) < 1e-6)


def _kl_text(m, a):
    return "; ".join(f"{kind}: {v['formula']}{' clamped to ' + format(v['max'], '.3g') if v['clamped'] else ''}"
                     for kind, v in m["kinds"].items() if kind in ("k1", "k2", "k3", "low_var_kl", "abs"))


def _kl_openrlhf(m, a):
    k = m["kinds"]
    return all(k[n]["formula"] == n and k[n]["clamped"] and abs(k[n]["max"] - 10) < 1e-6 for n in ("k1", "k2", "k3"))


def _advantage(m, a):
    return m["std"] == "Bessel (n-1)" and abs(m["epsilon"] - 1e-6) < 1e-8 and all(v == 0 for v in m["constant_group_advantages"])


def _advantage_text(m, a):
    return (f"std {m['std']} (std + ε = {m['std_plus_eps']:.6f}), ε = {m['epsilon']:.2e}, "
            f"constant group → {m['constant_group_advantages'][0]:g}")


def _dual_clip(m, a):
    return abs(m["loss_cap_negative_advantage"] - 3.0) < 1e-5 and abs(m["log_ratio_clamp"] - 20.0) < 1e-4


def _dual_clip_text(m, a):
    return f"A < 0 loss capped at {m['loss_cap_negative_advantage']:.3g}; |log-ratio| clamped at {m['log_ratio_clamp']:.3g}"


def _entropy(m, a):
    return m["computed"] == "after temperature"


def _entropy_text(m, a):
    return (f"{m['computed']} (τ = {m['temperature']}: |Δ| to H(softmax(z/τ)) {m['gap_to_entropy_at_tau']:.1e}, "
            f"to H(softmax(z)) {m['gap_to_entropy_at_1']:.2g})")


PARITY_TOLERANCE = 1e-5  # relative, fp32: the rollout-correction probes' bar


def _equal_to_verl(m) -> bool:
    """Every setting run by both, and weights (response tokens), masks and metrics within the tolerance."""
    return (m["compared"] == m["settings"] and m["weight_rel"] <= PARITY_TOLERANCE and m["metric_rel"] <= PARITY_TOLERANCE
            and m["masks_differ"] == 0 and m["key_mismatches"] == 0 and m["mismatch_metrics_rel"] <= PARITY_TOLERANCE)


def _verl_parity_text(m) -> str:
    text = (f"{m['compared']}/{m['settings']} settings · max rel Δ weights {m['weight_rel']:.1e}, metrics "
            f"{m['metric_rel']:.1e} · masks differing {m['masks_differ']}")
    if m["padding_weight_differs"]:
        text += f" · padding weights differ in {m['padding_weight_differs']} (verl NaN, workbench 0)"
    if m["refused_by_workbench_only"]:
        text += (f" · workbench refuses {m['refused_by_workbench_only']}; verl NaN weights in {m['verl_nan_weights']}, "
                 f"NaN metrics in {m['verl_nan_metrics']}")
    if m["dtype"] == "bfloat16":
        text += (f" · vs verl on the fp32 upcast: weights {m['weight_rel_vs_upcast']:.1e}, metrics "
                 f"{m['metric_rel_vs_upcast']:.1e}")
    return text


def _verl_rollout_correction(case: str) -> Expectation:
    """verl 0.9.1's rollout correction against the workbench's, case by case (the differences are findings)."""
    if case == "nan":
        return Expectation("P12", "convention", "NaN in the response: verl gives NaN metrics (and NaN TIS weights); the "
                           "workbench refuses", lambda m, a: m["refused_by_workbench_only"] == m["settings"]
                           and m["verl_nan_metrics"] == m["settings"], lambda m, a: _verl_parity_text(m))
    if case == "nan_padding":
        return Expectation("P12", "convention", "equal within 1e-5; verl's token TIS weights are NaN in the padding",
                           lambda m, a: _equal_to_verl(m) and m["padding_weight_differs"] > 0, lambda m, a: _verl_parity_text(m))
    if case == "bf16":
        return Expectation("P12", "convention", "equal to verl on the fp32 upcast within 1e-5 (verl computes in bf16)",
                           lambda m, a: m["compared"] == m["settings"] and m["weight_rel_vs_upcast"] <= PARITY_TOLERANCE
                           and m["metric_rel_vs_upcast"] <= PARITY_TOLERANCE, lambda m, a: _verl_parity_text(m))
    return Expectation("P12", "convention", "every weight, mask entry and metric equal within 1e-5",
                       lambda m, a: _equal_to_verl(m) and m["padding_weight_differs"] == 0, lambda m, a: _verl_parity_text(m))


def _trl_rollout_correction() -> Expectation:
    def test(m, a):
        return (m["ratio_rel"] <= PARITY_TOLERANCE and m["metric_rel"] <= PARITY_TOLERANCE and m["key_mismatches"] == 0
                and m["mask_mismatches"] == 0 and m["off_policy_differs"] == 0)

    def describe(m, a):
        return (f"{m['settings']} IS settings · max rel Δ ratios {m['ratio_rel']:.1e}, metrics {m['metric_rel']:.1e} · "
                f"off-policy masks differing {m['off_policy_differs']}/{m['off_policy_settings']} · padding ratios differ "
                f"in {m['padding_ratio_differs']} (TRL 1 or its clip, workbench 0)")
    return Expectation("P12", "convention", "ratios (response tokens), metrics and off-policy masks equal within 1e-5",
                       test, describe)


def _conventions() -> dict[str, tuple]:
    """probe → (seed, kind, expected, check, describe) for the rows that are one convention per probe."""
    return {
        "temperature": ("P6", "convention", "log-probs of softmax(logits / τ)", _audit_passed, _audit_text),
        "kl_estimators": ("P9", "convention", "k1, k2, k3 each clamped to ±10", _kl_openrlhf, _kl_text),
        "kl_penalty": ("P9", "convention", "k1, k2 unclamped; low_var_kl = k3 clamped to ±10", _kl_verl, _kl_text),
        "entropy_temperature": ("P15", "convention", "entropy of the temperature-scaled logits", _entropy, _entropy_text),
        "grpo_advantage": ("S5", "convention", "Bessel std, ε = 1e-6, constant group → 0", _advantage, _advantage_text),
        "dual_clip": ("PPO", "convention", "dual-clip c = 3 for A < 0, log-ratio clamped to ±20", _dual_clip, _dual_clip_text),
    }


def expectation(peer: str, version: str, probe: str, measured: dict) -> Expectation | None:
    """What a (peer, version, probe) row should show; None for a row this table does not judge."""
    key = measured.get("loss_type") or measured.get("loss_agg_mode")
    if probe == "s3_eos_stopping" and peer == "trl":
        if version.startswith("0.11"):
            return Expectation("S3", "bug", "rollout runs to response_length, not to EOS",
                               lambda m, a: m["tokens_generated_per_row"] == m["max_new_tokens"] > m["longest_needed"], _eos_text)
        return Expectation("S3", "fix", "generation stops at EOS",
                           lambda m, a: m["tokens_generated_per_row"] <= m["longest_needed"], _eos_text)
    if probe == "s3_eos_stopping_stop_token":
        return Expectation("S3", "convention", 'stop_token="eos" truncates afterwards; still runs to response_length',
                           lambda m, a: m["tokens_generated_per_row"] == m["max_new_tokens"], _eos_text)
    if probe == "s3_watch" and peer == "trl":
        if version.startswith("0.11"):
            return Expectation("S3", "bug", "watch flags S3 with its wasted decoding forwards", _watch_s3(True), _watch_text)
        return Expectation("S3", "fix", "watch: no S3 finding (generation stops at EOS)", _watch_s3(False), _watch_text)
    if probe == "s3_watch_stop_token":
        return Expectation("S3", "convention", 'stop_token="eos" truncates afterwards: watch still flags S3', _watch_s3(True),
                           _watch_text)
    if probe == "s5_zero_loss":
        if version.startswith("0.15"):
            return Expectation("S5", "fix", "0 (per-sequence mean, as in the GRPO paper)", *_zero_loss(True))
        if version.startswith("0.16"):
            return Expectation("S5", "bug", "≠ 0 (global token mean)", *_zero_loss(False))
    if probe == "aggregation":
        if peer == "trl":
            if version.startswith("0.15"):
                return Expectation("S5", "convention", "seq-mean-token-mean", *_agg("seq-mean-token-mean"))
            if version.startswith("0.16"):
                return Expectation("S5", "convention", "token-mean", *_agg("token-mean"))
            wanted = {"grpo": ("seq-mean-token-mean", None), "bnpo": ("token-mean", None), "dapo": ("token-mean", None),
                      "dr_grpo": ("seq-mean-token-sum-norm", "B × T")}[key]
            return Expectation("S5", "convention", f"loss_type={key}: {wanted[0]}" + (f", C = {wanted[1]}" if wanted[1] else ""),
                               *_agg(*wanted))
        if peer == "verl":  # agg_loss: seq-mean (over non-empty rows) of token sums, then / loss_scale_factor (= T)
            constant = "(= B × T)" if key == "seq-mean-token-sum-norm" else None
            return Expectation("S5", "convention", f"{key}" + (", C = B × T (rows × max response length)" if constant else ""),
                               *_agg(key, constant))
        if peer == "openrlhf":
            mode = "token-mean" if measured.get("token_level_loss") else "seq-mean-token-mean"
            name = f"{measured.get('function')}(token_level_loss={measured.get('token_level_loss')})"
            return Expectation("S5", "convention", f"{name}: {mode}", *_agg(mode))
    if probe == "s2_flash_right_padding":
        if version.startswith("4.41"):
            return Expectation("S2", "bug", "right padding → ValueError (padding_side='right')", *_flash(True))
        return Expectation("S2", "fix", "right padding accepted (check removed)", *_flash(False))
    if probe == "s2_flash_left_padding":
        return Expectation("S2", "convention", "left padding accepted", *_flash(False))
    if probe == "dpo_mask":
        return Expectation("S4", "fix", "prompt tokens masked on chosen and rejected rows", _audit_passed, _audit_text)
    if probe == "position_ids" and peer == "trl":
        return Expectation("S1", "convention", "no position_ids in the GRPO log-prob forward: GPT-2 exposed (TRL #6800)",
                           lambda m, a: bool(a) and not a["passed"] and a["convention"] == "model default", _audit_text)
    if probe == "position_ids":
        return Expectation("S1", "fix", "position ids from the mask (left padding = alone)", _audit_passed, _audit_text)
    if probe == "rollout_correction" and peer == "verl":
        return _verl_rollout_correction(measured.get("case", ""))
    if probe == "trl_rollout_correction":
        return _trl_rollout_correction()
    if probe in CONVENTION_PROBES:  # probes judged the same way whatever the peer
        return Expectation(*CONVENTION_PROBES[probe])
    return None


def judge(peer: str, version: str, row: dict) -> dict:
    """One adapter row → one table row."""
    measured, audit = row.get("measured", {}), row.get("audit")
    label = measured.get("loss_type") or measured.get("loss_agg_mode") or measured.get("case")
    if measured.get("function"):
        label = f"{measured['function']}, token_level_loss={measured['token_level_loss']}"
    probe = row["probe"] + (f" [{label}]" if label else "")
    exp = expectation(peer, version, row["probe"], measured)
    if exp is None:
        return {"peer": peer, "version": version, "probe": probe, "expected": "", "measured": str(measured)[:120],
                "verdict": "not judged", "role": "info", "seed": ""}
    try:
        ok = bool(exp.test(measured, audit))
        text = exp.describe(measured, audit)
    except (KeyError, TypeError, ValueError) as exc:
        ok, text = False, f"unreadable measurement ({type(exc).__name__}: {exc})"
    return {"peer": peer, "version": version, "probe": probe, "expected": exp.expected, "measured": text,
            "verdict": AS_EXPECTED if ok else DIFFERS, "role": exp.role, "seed": exp.seed}


def placeholder_rows(peer: str, version: str, planned: list[tuple[str, str, str]], status: str, reason: str) -> list[dict]:
    """Rows for a peer that could not run: the probes it would have run, each skipped/error with the reason."""
    return [{"peer": peer, "version": version, "probe": probe, "expected": expected, "measured": reason[:300],
             "verdict": SKIPPED if status == "skipped" else ERROR, "role": role, "seed": seed}
            for probe, seed, role, expected in planned]


def verdict(rows: list[dict]) -> tuple[bool, bool]:
    """(reproduced, fixed): every bug row measured and showing its bug; every fix row measured and clean."""
    bugs = [r for r in rows if r["role"] == "bug"]
    fixes = [r for r in rows if r["role"] == "fix"]
    reproduced = bool(bugs) and all(r["verdict"] == AS_EXPECTED for r in bugs)
    fixed = bool(fixes) and all(r["verdict"] == AS_EXPECTED for r in fixes)
    return reproduced, fixed


def table(rows: list[dict], fmt: str = "markdown") -> str:
    """peer · version · probe · expected · measured · verdict, as Markdown (or plain text)."""
    cols = ("peer", "version", "probe", "expected", "measured", "verdict")
    if fmt == "markdown":
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
        return "\n".join(lines)
    widths = [min(60, max(len(c), *(len(str(r[c])) for r in rows))) for c in cols] if rows else [len(c) for c in cols]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    out += ["  ".join(str(r[c])[:w].ljust(w) for c, w in zip(cols, widths, strict=True)) for r in rows]
    return "\n".join(out)


def counts(rows: list[dict]) -> dict:
    out = {}
    for row in rows:
        out[row["verdict"]] = out.get(row["verdict"], 0) + 1
    return out


# ---------------------------------------------------------------- figures (one per seed, bug vs fix)


def _bars(ax, labels, values, bug_mask, ylabel, title, annotate="{:.3g}"):
    colors = [plots.NEUTRAL_COLOR if b is None else plots.BUG_COLOR if b else plots.FIX_COLOR for b in bug_mask]
    ax.bar(range(len(values)), values, color=colors)
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, fontsize=8)
    for i, v in enumerate(values):
        ax.annotate(annotate.format(v), (i, v), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return ax


def plot_s3(ax, payloads: dict):
    """Decoding steps per batch vs tokens the longest response needed: TRL 0.11.4 PPOv2 vs TRL 1.16 GRPO."""
    labels, values, bug = [], [], []
    for name, bug_side in (("trl-0.11.4", True), ("trl-1.16-eos", False)):
        for row in payloads.get(name, {}).get("rows", []):
            if row["probe"] == "s3_eos_stopping":
                m = row["measured"]
                title = "TRL 0.11.4\nPPOv2" if bug_side else "TRL 1.16\nGRPO"  # three short lines: the labels fit
                labels += [f"{title}\nsteps", f"{title}\nneeded"]
                values += [m["tokens_generated_per_row"], m["longest_needed"]]
                bug += [bug_side, None]
    if not values:
        ax.text(0.5, 0.5, "S3: no measured release (skipped)", ha="center", transform=ax.transAxes)
        return ax
    return _bars(ax, labels, values, bug, "tokens per row", "S3 · decoding steps vs needed", "{:.0f}")


CONVENTION_COLORS = {"seq-mean-token-mean": 2, "token-mean": 1, "seq-mean-token-sum-norm": 5}  # SERIES_COLORS index


def s5_bars(payloads: dict) -> list[dict]:
    """One row per TRL release (and TRL 1.16 loss type) from the SAME probe, ``aggregation`` (one ragged
    batch, lengths ``PROBE_LENGTHS["main"]``): ``label``, ``mode`` (the measured convention), ``value`` (the loss
    of a zero-mean advantage group at ρ = 1) and ``rows_x_T`` (the normaliser C of seq-mean-token-sum-norm, or None).

    The ``s5_zero_loss`` probe (the seed's batch, lengths [2, 3, 5, 8]) gives other numbers for the same
    conventions, so it is never drawn beside these."""
    bars = []
    for name in ("trl-0.15.2", "trl-0.16.1", "trl-1.16"):
        for row in payloads.get(name, {}).get("rows", []):
            if row["probe"] != "aggregation" or not row.get("audit"):
                continue
            details = row["audit"]["details"]
            loss_type = row["measured"].get("loss_type")
            label = f"TRL {name[4:]}" + (f"\n{loss_type}" if loss_type else "")
            mode = details.get("mode", "unknown")
            bars.append({"label": label, "mode": mode, "value": float(details["value"]),
                         "norm_constant": details.get("norm_constant") if mode == "seq-mean-token-sum-norm" else None})
    return bars


def plot_s5(ax, payloads: dict):
    """S5 across TRL releases on one probe (``aggregation``), each bar coloured by its measured convention (the
    same convention has the same colour in every release); 0.15.2 → 0.16.1 is the S5 change, named in the title.
    A seq-mean-token-sum-norm bar names its constant C = B × T: its loss scales with 1/T, so a probe with another
    max_completion_length (91 uses 16, the lab 8) reads another value."""
    bars = s5_bars(payloads)
    if not bars:
        ax.text(0.5, 0.5, "S5: no measured release (skipped)", ha="center", transform=ax.transAxes)
        return ax
    rows = len(PROBE_LENGTHS["main"])
    seen = set()
    for i, b in enumerate(bars):
        color = plots.SERIES_COLORS[CONVENTION_COLORS.get(b["mode"], 6)]
        label = None if b["mode"] in seen else b["mode"]
        seen.add(b["mode"])
        ax.bar(i, b["value"], color=color, label=label)
        text = f"{b['value']:.3g}" + (f"\nC = B × {b['norm_constant'] / rows:g}" if b["norm_constant"] else "")
        ax.annotate(text, (i, b["value"]), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.axhline(0, color=plots.NEUTRAL_COLOR, linewidth=0.8)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b["label"] for b in bars], fontsize=8)
    ax.set_ylabel("loss (β = 0, ρ = 1)")
    ax.set_title("S5 · loss of a zero-mean group")
    ax.set_ylim(top=1.3 * max([b["value"] for b in bars] + [1e-3]))  # headroom for the values written on the bars
    plots.legend_outside(ax, "right", title="measured convention", title_fontsize=8)
    return ax


def plot_s2(ax, payloads: dict):
    """Whether the release's own Qwen2 flash-attention forward raised, per padding side."""
    labels, values, bug = [], [], []
    for name in ("transformers-4.41.2", "transformers-4.42.4"):
        for row in payloads.get(name, {}).get("rows", []):
            m = row["measured"]
            labels.append(f"{name.split('-')[1]}\n{m['padding_side']}")
            values.append(1.0 if m["raised"] else 0.0)
            bug.append(bool(m["raised"]))
    if not values:
        ax.text(0.5, 0.5, "S2: no measured release (skipped)", ha="center", transform=ax.transAxes)
        return ax
    ax.set_ylim(0, 1.25)
    return _bars(ax, labels, values, bug, "raised ValueError (1 = yes)", "S2 · flash-attn 2 + use_cache", "{:.0f}")


SEED_FIGURES = {"S3 · EOS stopping": plot_s3, "S5 · loss aggregation": plot_s5, "S2 · flash attention": plot_s2}
OPENRLHF_AUDITS = ("position_ids", "dpo_mask")  # S1 and S4, checked with workbench.audit in OpenRLHF 0.11.2's own code


def figure_peer_lab(payloads: dict):
    """The notebook's seed figure, ``plots.NOTEBOOK_WIDTH`` wide: S3 and S2 side by side, S5 (more bars, a legend at its
    right) below them across the width; ``peer_lab_note`` is its caption."""
    fig = plt.figure(figsize=(plots.NOTEBOOK_WIDTH, 7.2))
    grid = fig.add_gridspec(2, 2)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, :]), fig.add_subplot(grid[0, 1])]
    for ax, plot in zip(axes, (plot_s3, plot_s5, plot_s2), strict=True):
        plot(ax, payloads)
    fig.tight_layout()
    return fig


def peer_lab_note(payloads: dict) -> str:
    """The caption printed under the seed figure: what each panel measures, and S5's change between releases."""
    bars = {b["label"]: b for b in s5_bars(payloads)}
    old, new = bars.get("TRL 0.15.2"), bars.get("TRL 0.16.1")
    change = f" (0.15.2 → 0.16.1, the S5 change: {old['mode']} → {new['mode']})" if old and new else ""
    return ("S3: decoding steps each rollout row ran vs the tokens its longest response needed (vermilion: the release "
            "that ignores EOS). S5: each TRL release's own loss on one zero-mean advantage group (β = 0, ratio 1, lengths "
            f"{PROBE_LENGTHS['main']}), coloured by the convention it measured{change}; C = B × T is "
            "seq-mean-token-sum-norm's constant. S2: whether the release's Qwen2 forward raised on each padding side "
            "(vermilion: it raised).")


def openrlhf_audits(payloads: dict) -> dict[str, AuditResult]:
    """The ``workbench.audit`` results of OpenRLHF 0.11.2's S1/S4 probes that ran, by probe name."""
    return {r["probe"]: AuditResult.from_dict(r["audit"]) for r in payloads.get("openrlhf-0.11.2", {}).get("rows", [])
            if r.get("audit") and r["probe"] in OPENRLHF_AUDITS}


def plot_openrlhf_audit(ax, audits: dict[str, AuditResult], name: str):
    """One OpenRLHF audit's figure, titled with its convention, or "skipped" when it did not run."""
    if name in audits:
        audits[name].plot(ax)
        title = textwrap.fill(f"OpenRLHF 0.11.2 · {name}: {audits[name].convention}", 44, max_lines=2, placeholder=" …")
        ax.set_title(title, fontsize=9)
    else:
        ax.text(0.5, 0.5, f"OpenRLHF {name}: skipped", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
    return ax


def figure_openrlhf_s1_s4(payloads: dict):
    audits = openrlhf_audits(payloads)
    fig, axes = plots.panel_grid(2, panel_height=3.8)
    for ax, name in zip(axes, OPENRLHF_AUDITS, strict=True):
        plot_openrlhf_audit(ax, audits, name)
    fig.tight_layout()
    return fig


def seed_figure_explorer(rows: list[dict], payloads: dict) -> Explorer:
    """A dropdown over the seeds measured in released code: that seed's figure, larger, and its table rows."""

    def draw(seed):
        fig, ax = plt.subplots(figsize=(7, 4))
        SEED_FIGURES[seed](ax, payloads)
        prefix = seed.split(" ")[0].lower()
        return {"seed": seed, "rows": [r for r in rows if r["probe"].startswith(prefix)], "bars": len(ax.patches)}

    dropdown = widgets.Dropdown(options=list(SEED_FIGURES), description="seed")
    return Explorer({"seed": dropdown}, draw, title="Peer lab: one seed's measurement in the releases that shipped it")


def metrics(rows: list[dict], payloads: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 90."""
    reproduced, fixed = verdict(rows)
    s3, _ = headline(rows, payloads)
    skipped = skipped_reason(rows)
    return dict(
        notebook="90_peer_lab", reproduced=reproduced, fixed=fixed,
        metrics={"probes": [{k: r[k] for k in ("peer", "version", "probe", "expected", "measured", "verdict")} for r in rows],
                 "roles": {r["probe"] + "@" + r["version"]: r["role"] for r in rows}, "counts": counts(rows),
                 "environments": {k: p.get("environment", {}) for k, p in payloads.items()},
                 **({"skipped": skipped} if skipped else {})},
        headline={"what": "S3 decoding steps per rollout batch (TRL 0.11.4 PPOv2 vs TRL 1.16 GRPO)", "unit": "steps",
                  "bug": s3[0], "fix": s3[1]},
    )


# ---------------------------------------------------------------- headline and the conclusion in words


def _measured(payloads: dict, key: str, probe: str) -> dict | None:
    for row in payloads.get(key, {}).get("rows", []):
        if row["probe"] == probe:
            return row["measured"]
    return None


def headline(rows: list[dict], payloads: dict) -> tuple[tuple[float, float], tuple[float, float]]:
    """((S3 decoding steps bug, fix), (S5 zero-loss bug, fix)); NaN where a release was skipped."""
    nan = float("nan")
    bug_eos = _measured(payloads, "trl-0.11.4", "s3_eos_stopping")
    fix_eos = _measured(payloads, "trl-1.16-eos", "s3_eos_stopping")
    bug_loss, fix_loss = _measured(payloads, "trl-0.16.1", "s5_zero_loss"), _measured(payloads, "trl-0.15.2", "s5_zero_loss")
    s3 = (float(bug_eos["tokens_generated_per_row"]) if bug_eos else nan,
          float(fix_eos["tokens_generated_per_row"]) if fix_eos else nan)
    s5 = (float(bug_loss["loss"]) if bug_loss else nan, float(fix_loss["loss"]) if fix_loss else nan)
    return s3, s5


def conclusion(rows: list[dict]) -> str:
    """The verdict in words, chosen by the rows (what was measured, what was skipped, what differed)."""
    reproduced, fixed = verdict(rows)
    lines = []
    for role, word in (("bug", "buggy"), ("fix", "fixed")):
        group = [r for r in rows if r["role"] == role]
        measured = [r for r in group if r["verdict"] in (AS_EXPECTED, DIFFERS)]
        lines.append(f"{word} releases: {len(measured)}/{len(group)} probes measured, "
                     f"{sum(r['verdict'] == AS_EXPECTED for r in measured)} as expected"
                     + "".join(f"\n  - {r['peer']} {r['version']} {r['probe']}: {r['verdict']} ({r['measured'][:90]})"
                               for r in group if r["verdict"] != AS_EXPECTED))
    conventions = [r for r in rows if r["role"] == "convention"]
    lines.append(f"conventions: {sum(r['verdict'] == AS_EXPECTED for r in conventions)}/{len(conventions)} as documented"
                 + "".join(f"\n  - {r['peer']} {r['version']} {r['probe']}: {r['verdict']} ({r['measured'][:90]})"
                           for r in conventions if r["verdict"] != AS_EXPECTED))
    if reproduced and fixed:
        lines.append("→ every buggy release shows its bug and every fixed release is clean, in the libraries' own code.")
    elif not reproduced:
        lines.append("→ not every seed bug was reproduced in its release (see the rows above: skipped or different).")
    else:
        lines.append("→ a fixed release still shows a bug or was not measured (see the rows above).")
    return "\n".join(lines)


def skipped_reason(rows: list[dict]) -> str:
    """Why a bug or fix row could not be measured ("" when every one was): the catalogue test skips on it."""
    missing = [r for r in rows if r["role"] in ("bug", "fix") and r["verdict"] in (SKIPPED, ERROR)]
    if not missing:
        return ""
    first = missing[0]
    return (f"{len(missing)} bug/fix probes not measured, e.g. {first['peer']} {first['version']}: {first['measured'][:200]} "
            "(run `make peers`)")


CONVENTION_PROBES = _conventions()
