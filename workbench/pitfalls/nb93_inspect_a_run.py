"""Notebook 93 (inspect a run): rollout dumps of the workbench's own GRPO runs, each with one planted fault, read by
``workbench.inspect`` side by side with a clean run's, and drawn from the records themselves.

Not a pitfall: like notebooks 91 (audit) and 92 (watch) it shows a tool. The dumps are written by the trainer's
``dump_rollouts`` option (``workbench.core.rollout_dump``: one record per response, one file per step), exactly what
``python -m workbench train grpo --dump-rollouts DIR`` writes, so the user can run ``python -m workbench inspect DIR``
on each folder. Four faults, each with the pitfall id the inspector should name (``FAULTS``):

* a bf16 sampler under an fp32 trainer (``sampler_precision="bf16"``): P12, the training–inference gap;
* stale sampler weights (``rollout_staleness=2``): P28, samples from an older policy;
* truncated responses rewarded (``score_truncated_as_finished=True`` with a short budget): P11;
* pad = EOS: the clean run's records with the loss mask a trainer builds as ``ids != pad`` when the pad token is the
  EOS (TRL's old PPOTrainer): the EOS that ends each stopped response is masked out — P8. The workbench's GRPO builds
  its mask from the sampler's stop, so this fault is applied to the records, not trained.

The figures are drawn from the records (the per-token gap |log π_sampler − log π_old|) and from
``core.rollout_correction.mismatch_metrics`` (verl's ``rollout_corr/`` names), not from the inspector's report, so they
check it rather than repeat it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np

from workbench.core import progress
from workbench.core.rollout_correction import mismatch_metrics
from workbench.core.rollout_dump import RolloutDumpWriter, read_dump
from workbench.experiments.checkpoints import load
from workbench.inspect.findings import K3_INFO, K3_WARNING
from workbench.inspect.gaps import padded_logprobs
from workbench.inspect.inspector import inspect
from workbench.inspect.report import InspectReport
from workbench.tasks import rl_problems
from workbench.tasks.registry import task_info
from workbench.trainers.grpo import GRPOConfig, GRPOTrainer
from workbench.viz import plots
from workbench.viz.explorer import Explorer

CLEAN = "clean"
# fault -> (GRPOConfig fields the run changes, the pitfall id the inspector should name); None: derived, not trained
FAULTS = {
    "bf16 sampler": ({"sampler_precision": "bf16"}, "P12"),
    "stale sampler": ({"rollout_staleness": 2}, "P28"),
    "truncation rewarded": ({"score_truncated_as_finished": True, "max_new_tokens": 3}, "P11"),
    "pad = EOS": (None, "P8"),
}
RUNS = (CLEAN, *FAULTS)
GAP_RUNS = (CLEAN, "bf16 sampler", "stale sampler")  # the runs whose sampler differs from the trainer, and the clean one


# ---- measurements --------------------------------------------------------------------------------
def dump_run(model, tokenizer, folder: str | Path, *, task: str, steps: int, prompts_per_step: int, num_generations: int,
             seed: int = 0, **fields) -> list[dict]:
    """A GRPO run of a copy of ``model`` on ``task``'s prompts with ``dump_rollouts=folder`` and the config ``fields``
    (``max_new_tokens`` among them); returns the dump's records as read back from ``folder``."""
    config = GRPOConfig(steps=steps, prompts_per_step=prompts_per_step, num_generations=num_generations, seed=seed,
                        progress=False, dump_rollouts=str(folder), **fields)
    GRPOTrainer(copy.deepcopy(model), tokenizer, rl_problems(64, task), config).train()
    return list(read_dump(folder))


def pad_equals_eos(records: list[dict], eos_token_id: int) -> list[dict]:
    """The records as a trainer whose pad token is the EOS writes them: loss mask ``ids != pad``, so every EOS
    (the token that ends a stopped response) is masked out."""
    return [{**record, "loss_mask": [0 if token == eos_token_id else mask
                                     for token, mask in zip(record["response_ids"], record["loss_mask"], strict=True)]}
            for record in records]


def token_gaps(records: list[dict]) -> np.ndarray:
    """|log π_sampler − log π_old| per response (rows, in dump order) and position (columns); NaN past a response's
    end and on tokens out of the loss mask."""
    width = max((len(r["response_ids"]) for r in records), default=0)
    gaps = np.full((len(records), width), np.nan)
    for row, record in enumerate(records):
        sampled, trained = np.asarray(record["rollout_logprobs"]), np.asarray(record["trainer_logprobs"])
        keep = np.asarray(record["loss_mask"], dtype=bool)
        gaps[row, : len(sampled)] = np.where(keep, np.abs(sampled - trained), np.nan)
    return gaps


def gap_by_step(records: list[dict]) -> dict[int, dict[str, float]]:
    """Per step, verl's ``rollout_corr/`` mismatch metrics of the step's responses (``mismatch_metrics`` on padded
    tensors) with the mean |Δ log p| over the step's trained tokens."""
    steps = sorted({r["step"] for r in records})
    out = {}
    for step in steps:
        rows = [r for r in records if r["step"] == step]
        trained, sampled, mask = padded_logprobs(rows)
        metrics = mismatch_metrics(trained, sampled, mask)
        metrics["abs_log_ratio_mean"] = float(((trained - sampled).abs() * mask).sum() / mask.sum().clamp(min=1))
        out[step] = {k: float(v) for k, v in metrics.items()}
    return out


def length_counts(records: list[dict]) -> dict[tuple[str, bool], dict[int, int]]:
    """Responses by (finish reason, rewarded: reward > 0) and length: ``{(finish, rewarded): {length: count}}``."""
    counts: dict[tuple[str, bool], dict[int, int]] = {}
    for record in records:
        key = (record["finish"], record["reward"] > 0)
        length = len(record["response_ids"])
        counts.setdefault(key, {})[length] = counts.setdefault(key, {}).get(length, 0) + 1
    return counts


# ---- sweeps --------------------------------------------------------------------------------------
def dump_runs(model_name: str, folder: str | Path, *, task: str = "restate", steps: int = 6, prompts_per_step: int = 4,
              num_generations: int = 4, seed: int = 0) -> tuple[dict[str, list[dict]], int]:
    """Every run of ``RUNS`` dumped under ``folder/<run>`` (pad = EOS: the clean records rewritten, then written with
    ``write_records``); returns ``({run: records}, eos_token_id)``."""
    model, tokenizer = load(model_name)
    shape = {"task": task, "steps": steps, "prompts_per_step": prompts_per_step, "num_generations": num_generations, "seed": seed,
             "max_new_tokens": task_info(task).max_new_tokens}
    dumps = {}
    for run in progress.track(RUNS, "dumped runs", unit="run"):
        fields = {} if run == CLEAN else FAULTS[run][0]
        if fields is None:
            continue
        dumps[run] = dump_run(model, tokenizer, Path(folder) / folder_name(run), **{**shape, **fields})
    dumps["pad = EOS"] = pad_equals_eos(dumps[CLEAN], tokenizer.eos_token_id)
    write_records(Path(folder) / folder_name("pad = EOS"), dumps["pad = EOS"])
    return {run: dumps[run] for run in RUNS}, int(tokenizer.eos_token_id)


def folder_name(run: str) -> str:
    return run.replace(" = ", "_equals_").replace(" ", "_").lower()


def write_records(folder: Path, records: list[dict]) -> None:
    """``records`` as a dump folder, one file per step (``core.rollout_dump.RolloutDumpWriter``)."""
    writer = RolloutDumpWriter(folder)
    writer.start(0)
    for step in sorted({r["step"] for r in records}):
        writer.write_step(step, [r for r in records if r["step"] == step])


def inspect_dumps(dumps: dict[str, list[dict]]) -> dict[str, InspectReport]:
    """``workbench.inspect`` on each run's records."""
    return {run: inspect(records, show_progress=False) for run, records in dumps.items()}


def named(reports: dict[str, InspectReport]) -> dict[str, dict]:
    """Per fault: the pitfall expected, whether the inspector named it, and at which severities."""
    out = {}
    for fault, (_, pitfall) in FAULTS.items():
        severities = sorted({f.severity for f in reports[fault].findings if f.pitfall == pitfall})
        out[fault] = {"pitfall": pitfall, "named": bool(severities), "severities": severities}
    return out


def headline_row(reports: dict[str, InspectReport]) -> dict:
    """The report's headline: error findings in the worst faulty dump against the clean one."""
    return {"what": "inspector findings of error severity (worst faulty dump vs clean)", "unit": "findings",
            "bug": max(len(reports[f].errors) for f in FAULTS), "fix": len(reports[CLEAN].errors)}


# ---- verdict -------------------------------------------------------------------------------------
def verdict(reports: dict[str, InspectReport]) -> tuple[bool, bool]:
    """Reproduced: every planted fault named by its pitfall id (any severity); fixed: the clean dump has no finding of
    error severity."""
    return all(entry["named"] for entry in named(reports).values()), not reports[CLEAN].errors


def not_shown(reports: dict[str, InspectReport]) -> list[str]:
    """Why a planted fault went unnamed on this checkpoint, with the numbers the inspector measured (``not_shown``)."""
    reasons = []
    for fault, row in named(reports).items():
        if row["named"]:
            continue
        report = reports[fault]
        shares = {key.removeprefix("inspect/finish_").removesuffix("_share"): round(value, 3)
                  for key, value in report.metrics.items() if key.startswith("inspect/finish_")}
        reasons.append(f"the inspector did not name {row['pitfall']} in the '{fault}' dump of this checkpoint: k3 KL "
                       f"{report.metrics.get('rollout_corr/k3_kl', float('nan')):.2g} per token, finish shares {shares or 'none'}, "
                       f"findings {sorted(report.pitfalls()) or 'none'} (a checkpoint that never stops or never earns a "
                       "reward leaves some faults nothing to show)")
    return reasons


# ---- figures -------------------------------------------------------------------------------------
def plot_gap_heatmap(ax, gaps: np.ndarray, title: str, vmax: float):
    """One run's per-token gap, responses down and positions across; returns the image (for a colour bar)."""
    image = ax.imshow(gaps, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0, vmax=vmax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("response position")
    ax.set_ylabel("response (step by step)")
    plots.integer_axis(ax.xaxis)
    plots.integer_axis(ax.yaxis)
    return image


def figure_gap_heatmaps(dumps: dict[str, list[dict]]):
    """The per-token gap of the clean run and the two runs whose sampler differs from the trainer, on one colour scale."""
    gaps = {run: token_gaps(dumps[run]) for run in GAP_RUNS}
    vmax = max(float(np.nanmax(g)) if np.isfinite(g).any() else 0.0 for g in gaps.values()) or 1.0
    fig, axes = plots.panel_grid(len(GAP_RUNS), panel_height=3.4)
    image = None
    for ax, (run, values) in zip(axes, gaps.items(), strict=True):
        image = plot_gap_heatmap(ax, values, run, vmax)
    for ax in axes[1:]:
        ax.set_ylabel("")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    bar = fig.colorbar(image, cax=fig.add_axes((0.91, 0.2, 0.015, 0.65)))
    bar.set_label("|Δ log p| per token", fontsize=9)
    bar.ax.tick_params(labelsize=8)
    return fig


def plot_gap_over_steps(ax, per_step: dict[str, dict[int, dict[str, float]]], key: str = "abs_log_ratio_mean") -> None:
    """``key`` of each run's ``gap_by_step`` over the steps, one line per run (the clean one in the fix colour)."""
    ax.set_title("verl's k3 KL" if key == "rollout_corr/k3_kl" else "mean gap", fontsize=10)
    for index, (run, steps) in enumerate(per_step.items()):
        color = plots.FIX_COLOR if run == CLEAN else plots.SERIES_COLORS[index]
        ax.plot(list(steps), [values[key] for values in steps.values()], marker=plots.MARKERS[index], color=color,
                label=run, linestyle=plots.LINE_STYLES[index % len(plots.LINE_STYLES)])
    ax.set_xlabel("training step")
    ax.set_ylabel("mean |Δ log p| per token" if key == "abs_log_ratio_mean" else "k3 KL per token")
    plots.integer_axis(ax.xaxis)


def figure_gap_over_steps(per_step: dict[str, dict[int, dict[str, float]]]):
    """Two panels: the mean per-token gap and verl's k3 KL (``rollout_corr/k3_kl``), step by step, per run."""
    fig, axes = plots.panel_grid(2, panel_height=3.2)
    plot_gap_over_steps(axes[0], per_step)
    plot_gap_over_steps(axes[1], per_step, "rollout_corr/k3_kl")
    plots.figure_legend(fig, axes[0], ncol=len(per_step))
    return fig


LENGTH_CLASSES = (("stop", True), ("stop", False), ("length", True), ("length", False))


def plot_lengths(ax, counts: dict[tuple[str, bool], dict[int, int]], title: str) -> None:
    """Response lengths stacked by finish reason and reward (rewarded: reward > 0)."""
    lengths = sorted({n for by_length in counts.values() for n in by_length}) or [0]
    bottom = np.zeros(len(lengths))
    colors = dict(zip(LENGTH_CLASSES, (plots.SERIES_COLORS[2], plots.SERIES_COLORS[5], plots.SERIES_COLORS[0],
                                        plots.SERIES_COLORS[3]), strict=True))
    for key in LENGTH_CLASSES:
        heights = np.array([counts.get(key, {}).get(n, 0) for n in lengths], dtype=float)
        finish, rewarded = key
        ax.bar(lengths, heights, bottom=bottom, color=colors[key], label=f"{finish}, {'rewarded' if rewarded else 'reward 0'}")
        bottom += heights
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("responses")
    plots.integer_axis(ax.xaxis)
    plots.integer_axis(ax.yaxis)


def figure_lengths(dumps: dict[str, list[dict]]):
    """Length histograms by finish reason and reward: the clean run against the truncation-rewarded one."""
    fig, axes = plots.panel_grid(2, panel_height=3.2)
    for ax, run in zip(axes, (CLEAN, "truncation rewarded"), strict=True):
        plot_lengths(ax, length_counts(dumps[run]), run)
    plots.figure_legend(fig, axes[1], ncol=4)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def findings_table(reports: dict[str, InspectReport]) -> str:
    """Every run's findings, one line each: run, severity, pitfall, the first numbers of its evidence."""
    lines = [f"{'run':<20} {'severity':<8} {'pitfall':<7} evidence"]
    for run, report in reports.items():
        if not report.findings:
            lines.append(f"{run:<20} {'—':<8} {'—':<7} no finding")
        for f in report.findings:
            numbers = [(k, v) for k, v in f.evidence.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            evidence = ", ".join(f"{k}={v:.3g}" for k, v in numbers[:4])
            lines.append(f"{run:<20} {f.severity:<8} {f.pitfall:<7} {evidence}")
    return "\n".join(lines)


def named_lines(reports: dict[str, InspectReport]) -> str:
    """Each planted fault: named by its pitfall id (with the severities) or missed; the clean run's errors."""
    lines = []
    for fault, entry in named(reports).items():
        line = f"{fault}: {entry['pitfall']} " + (f"named ({', '.join(entry['severities'])})" if entry["named"] else "MISSED")
        k3 = reports[fault].metrics.get("rollout_corr/k3_kl")
        if entry["pitfall"] == "P12" and k3 is not None:
            line += f" — k3 KL {k3:.3g} per token (the inspector's bounds: info {K3_INFO:g}, warning {K3_WARNING:g})"
        lines.append(line)
    clean = reports[CLEAN]
    lines.append(f"clean: {len(clean.errors)} finding(s) of error severity"
                 + (f" ({', '.join(sorted(clean.pitfalls()))} at lower severity)" if clean.findings and not clean.errors else ""))
    return "\n".join(lines)


def gap_lines(per_step: dict[str, dict[int, dict[str, float]]]) -> str:
    """Per run, the k3 KL of the first and last step and the largest mean |Δ log p| over the steps."""
    lines = []
    for run, steps in per_step.items():
        first, last = steps[min(steps)], steps[max(steps)]
        peak = max(values["abs_log_ratio_mean"] for values in steps.values())
        lines.append(f"{run}: k3 KL {first['rollout_corr/k3_kl']:.3g} at step {min(steps)} → {last['rollout_corr/k3_kl']:.3g} "
                     f"at step {max(steps)}; mean |Δ log p| up to {peak:.3g}")
    return "\n".join(lines)


def dumps_lines(dumps: dict[str, list[dict]]) -> str:
    """Per run: responses, steps and response tokens in its dump, and its folder's name."""
    return "\n".join(f"{run}: {len(records)} responses over {len({r['step'] for r in records})} steps, "
                     f"{sum(len(r['response_ids']) for r in records)} response tokens → dumps/{folder_name(run)}/"
                     for run, records in dumps.items())


def heatmap_note(dumps: dict[str, list[dict]]) -> str:
    """The heat maps' caption, with the largest per-token gap of each run."""
    peaks = {run: np.nanmax(token_gaps(dumps[run])) for run in GAP_RUNS}
    return ("Rows: every response of the dump, step by step; columns: response positions; white: past the response's "
            "end. Largest |Δ log p|: " + ", ".join(f"{run} {value:.3g}" for run, value in peaks.items()) + ".")


# ---- explorer ------------------------------------------------------------------------------------
def inspect_explorer(dumps: dict[str, list[dict]], reports: dict[str, InspectReport]) -> Explorer:
    """A run dropdown and a step slider: that run's per-token gap up to the step, redrawn, and its findings printed."""
    last = max(r["step"] for records in dumps.values() for r in records)
    vmax = max(float(np.nanmax(g)) if np.isfinite(g).any() else 0.0 for g in map(token_gaps, dumps.values())) or 1.0

    def draw(run, up_to_step):
        records = [r for r in dumps[run] if r["step"] <= up_to_step]
        fig, ax = plt.subplots(figsize=(6, 3.4))
        plot_gap_heatmap(ax, token_gaps(records), f"{run}: steps 0–{up_to_step}", vmax)
        for finding in reports[run].findings:
            print(f"{finding.severity} {finding.pitfall}: {finding.message}")
        return {"run": run, "responses": len(records), "findings": len(reports[run].findings)}

    controls = {"run": widgets.Dropdown(options=list(dumps), description="run"),
                "up_to_step": widgets.IntSlider(value=last, min=0, max=last, description="up to step")}
    return Explorer(controls, draw, title="Inspect: one dump's per-token gap and findings")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(reports: dict[str, InspectReport], per_step: dict[str, dict[int, dict[str, float]]], eos_token_id: int) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 93."""
    reproduced, fixed = verdict(reports)
    return dict(
        notebook="93_inspect_a_run", reproduced=reproduced, fixed=fixed, not_shown=not_shown(reports),
        metrics={"named": named(reports), "eos_token_id": eos_token_id,
                 "errors": {run: len(report.errors) for run, report in reports.items()},
                 "pitfalls": {run: sorted(report.pitfalls()) for run, report in reports.items()},
                 "k3_kl": {run: report.metrics.get("rollout_corr/k3_kl") for run, report in reports.items()},
                 "gap_by_step": {run: {str(step): values for step, values in steps.items()} for run, steps in per_step.items()},
                 "reports": {run: report.to_dict() for run, report in reports.items()}},
        headline=headline_row(reports),
    )
