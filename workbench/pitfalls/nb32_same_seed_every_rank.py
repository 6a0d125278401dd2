"""Pitfall P32: the same sampling seed on every rank — a GRPO group split over processes holds copies.

GRPO samples ``group_size`` completions per prompt and, in data parallelism, spreads one prompt's group
over several processes (TRL's ``RepeatSampler`` hands the same prompt to every rank, each rank samples
``group_size / world_size`` of its completions). When every process seeds its sampler with the same
number (``set_seed(seed)``), rank 1 draws exactly the tokens rank 0 draws: a group of 8 over 2 ranks
holds 4 distinct completions twice. The group std, hence the advantage, is computed on copies; fewer
distinct answers also mean more groups whose rewards are all equal (zero std, no signal). TRL fixed it in
PR #2824 (Feb 2025: ``set_seed(args.seed, device_specific=True)``, i.e. seed + process index).

Here the measurement runs in real processes: ``trainers.distributed.run_cpu_group`` forks
``world_size`` CPU processes joined by gloo, each samples its share of every prompt's group with its
own generator and the shares are all-gathered. The sweep over larger world sizes simulates the ranks
in one process (rank r's generator seeded like rank r's would be), which is what the processes do.
"""

from __future__ import annotations

import os

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.modeling.rollout import sample
from workbench.tasks import encode_prompts, score_responses
from workbench.trainers.distributed import run_cpu_group
from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements --------------------------------------------------------------------------------
def rank_seed(seed: int, rank: int, device_specific: bool = True) -> int:
    """The sampling seed of ``rank``: ``seed + rank`` (the fix, accelerate's ``device_specific=True``) or
    ``seed`` on every rank (the bug)."""
    return seed + rank if device_specific else seed


@torch.no_grad()
def sample_share(model, tokenizer, problems, per_rank: int, seed: int, max_new_tokens: int = 6) -> dict:
    """``per_rank`` completions of every problem from a generator seeded with ``seed``:
    ``{"completions": [[token tuple] per slot] per problem, "rewards": [[float]]}``."""
    repeated = [p for p in problems for _ in range(per_rank)]
    ids, mask = encode_prompts(tokenizer, [p.prompt for p in repeated])
    rollout = sample(model, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed))
    rewards = score_responses(tokenizer, repeated, rollout.response_ids, rollout.response_mask, rollout.finished)
    tokens = [tuple(row[m.bool()].tolist()) for row, m in zip(rollout.response_ids, rollout.response_mask, strict=True)]
    return {"completions": [tokens[i * per_rank:(i + 1) * per_rank] for i in range(len(problems))],
            "rewards": rewards.float().view(len(problems), per_rank).tolist()}


def _rank_job(rank: int, world_size: int, model, tokenizer, problems, group_size: int, seed: int, device_specific: bool) -> dict:
    """One process's work: sample its share of each group, all-gather every rank's share (gloo)."""
    share = sample_share(model, tokenizer, problems, group_size // world_size, rank_seed(seed, rank, device_specific))
    gathered = [None] * world_size
    torch.distributed.all_gather_object(gathered, share)
    return {"rank": rank, "pid": os.getpid(), "shares": gathered}


def gathered_groups(shares: list[dict]) -> tuple[list[list[tuple]], list[list[float]]]:
    """Join the ranks' shares into whole groups: ``(completions, rewards)`` per problem, rank 0's slots first."""
    n = len(shares[0]["completions"])
    completions = [[c for share in shares for c in share["completions"][i]] for i in range(n)]
    rewards = [[r for share in shares for r in share["rewards"][i]] for i in range(n)]
    return completions, rewards


def group_statistics(shares: list[dict]) -> dict:
    """Distinct completions per group, the share of groups whose rewards are all equal (zero std), and the
    share of rank-1 slots whose completion equals rank 0's in the same slot (1.0 when the seeds are equal)."""
    completions, rewards = gathered_groups(shares)
    group_size = len(completions[0])
    distinct = [len({tuple(c) for c in group}) for group in completions]  # completions travel home as lists
    slots = [a == b for s0, s1 in zip(shares[0]["completions"], shares[-1]["completions"], strict=True)
             for a, b in zip(s0, s1, strict=True)] if len(shares) > 1 else [False]
    return {"world_size": len(shares), "group_size": group_size,
            "distinct_per_group": sum(distinct) / len(distinct), "distinct_share": sum(distinct) / (len(distinct) * group_size),
            "zero_std_share": sum(max(g) == min(g) for g in rewards) / len(rewards),
            "cross_rank_identical": sum(slots) / len(slots)}


def measure_processes(model, tokenizer, problems, *, group_size: int = 8, world_size: int = 2, seed: int = 0,
                      device_specific: bool = True) -> dict:
    """``group_statistics`` of groups sampled by ``world_size`` real CPU processes (gloo), each seeded by
    ``rank_seed``; the model must be on the CPU (the processes are forked)."""
    results = run_cpu_group(_rank_job, world_size, model, tokenizer, problems, group_size, seed, device_specific)
    return {"device_specific": device_specific, **group_statistics(results[0]["shares"]),
            "processes": len({r["pid"] for r in results} - {os.getpid()}),
            "shares_agree": all(r["shares"] == results[0]["shares"] for r in results)}


def simulate_ranks(model, tokenizer, problems, *, group_size: int, world_size: int, seed: int = 0, device_specific: bool = True) -> dict:
    """The same groups sampled in this process, rank r's share from rank r's generator (the sweep's path)."""
    shares = [sample_share(model, tokenizer, problems, group_size // world_size, rank_seed(seed, r, device_specific))
              for r in range(world_size)]
    return {"device_specific": device_specific, **group_statistics(shares)}


# ---- sweeps --------------------------------------------------------------------------------------
def measure_seedings(model, tokenizer, problems, *, group_size: int = 8, world_size: int = 2, seed: int = 0) -> tuple[dict, dict]:
    """``measure_processes`` with the same seed on every rank (the bug) and with seed + rank (the fix): ``(bug, fix)``."""
    bug, fix = (measure_processes(model, tokenizer, problems, group_size=group_size, world_size=world_size, seed=seed,
                                  device_specific=device_specific)
                for device_specific in progress.track((False, True), f"{world_size} processes, same seed then seed + rank"))
    return bug, fix


def world_size_sweep(model, tokenizer, problems, world_sizes: list[int], *, group_size: int = 8, seed: int = 0) -> list[dict]:
    """``simulate_ranks`` for each world size (a divisor of ``group_size``), both seedings."""
    runs = [(w, d) for w in world_sizes for d in (False, True)]
    return [simulate_ranks(model, tokenizer, problems, group_size=group_size, world_size=w, seed=seed, device_specific=d)
            for w, d in progress.track(runs, "world sizes × seedings")]


# ---- verdict -------------------------------------------------------------------------------------
def verdict(bug: dict, fix: dict, *, min_gain: float = 0.05) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``measure_processes`` with the same seed (``bug``) and per-rank seeds (``fix``).

    Reproduced: every rank-1 completion is rank 0's (cross-rank identical share 1) and at most
    group_size / world_size distinct completions per group. Fixed: the ranks' slots are not copies
    (identical share < 1) and the distinct share rises by at least ``min_gain``.
    """
    per_rank = bug["group_size"] / bug["world_size"]
    reproduced = bug["world_size"] > 1 and bug["cross_rank_identical"] == 1.0 and bug["distinct_per_group"] <= per_rank
    fixed = fix["cross_rank_identical"] < 1.0 and fix["distinct_share"] >= bug["distinct_share"] + min_gain
    return reproduced, fixed


# ---- figures -------------------------------------------------------------------------------------
def plot_processes(ax, bug: dict, fix: dict) -> None:
    """The real-process measurement: distinct share, zero-std groups and identical slots, bug vs fix."""
    keys = [("distinct_share", "distinct\ncompletions"), ("zero_std_share", "zero-std\ngroups"),
            ("cross_rank_identical", "rank 1 =\nrank 0")]
    x = range(len(keys))
    bars_bug = ax.bar([i - 0.2 for i in x], [bug[k] for k, _ in keys], 0.4, color=plots.BUG_COLOR, label="same seed (bug)")
    bars_fix = ax.bar([i + 0.2 for i in x], [fix[k] for k, _ in keys], 0.4, color=plots.FIX_COLOR, label="seed + rank (fix)")
    plots.label_zero_bars(ax, bars_bug)
    plots.label_zero_bars(ax, bars_fix)
    ax.set_xticks(list(x), [label for _, label in keys], fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share")
    ax.set_title(f"{bug['processes']} processes, group of {bug['group_size']}")
    plots.legend_outside(ax, bbox_to_anchor=(0.5, -0.25))


def plot_world_sizes(ax, rows: list[dict]) -> None:
    """Distinct completions per group vs the number of ranks the group is split over."""
    styles = ((False, plots.BUG_COLOR, "o-", "same seed (bug)"), (True, plots.FIX_COLOR, "s-", "seed + rank (fix)"))
    for device_specific, color, style, label in styles:
        sel = [r for r in rows if r["device_specific"] is device_specific]
        ax.plot([r["world_size"] for r in sel], [r["distinct_per_group"] for r in sel], style, color=color, label=label)
    sizes = sorted({r["world_size"] for r in rows})
    group_size = rows[0]["group_size"]
    ax.plot(sizes, [group_size / w for w in sizes], ":", color=plots.NEUTRAL_COLOR, label="group size / ranks")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("ranks sharing a group")
    ax.set_ylabel("distinct per group")
    ax.set_title("simulated ranks")
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax, bbox_to_anchor=(0.5, -0.25)))


def figure_same_seed(bug: dict, fix: dict, rows: list[dict]):
    """The notebook's figure: the real-process measurement and the world-size sweep."""
    fig, axes = plots.panel_grid(2, panel_height=4.0)
    plot_processes(axes[0], bug, fix)
    plot_world_sizes(axes[1], rows)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def process_lines(bug: dict, fix: dict) -> str:
    return "\n".join(
        f"{'same seed  ' if not r['device_specific'] else 'seed + rank'}: {r['processes']} processes, "
        f"{r['distinct_per_group']:.2f} of {r['group_size']} completions distinct per group, "
        f"{r['zero_std_share']:.0%} zero-std groups, rank-1 slot = rank-0 slot in {r['cross_rank_identical']:.0%}"
        for r in (bug, fix))


def sweep_lines(rows: list[dict]) -> str:
    return "\n".join(f"{r['world_size']} rank{'s' if r['world_size'] > 1 else ' '}, "
                     f"{'seed + rank' if r['device_specific'] else 'same seed  '}: "
                     f"{r['distinct_per_group']:.2f} distinct per group, {r['zero_std_share']:.0%} zero-std groups" for r in rows)


def headline_sentence(bug: dict, fix: dict) -> str:
    reproduced, fixed = verdict(bug, fix)
    return (f"distinct completions per group of {bug['group_size']}: {bug['distinct_per_group']:.2f} with the same seed on "
            f"{bug['processes']} ranks → {fix['distinct_per_group']:.2f} with seed + rank; "
            + ("the copies are the bug" if reproduced else "no copies across ranks at these settings")
            + (", and per-rank seeds remove them." if fixed else "."))


def same_seed_note(bug: dict, rows: list[dict]) -> str:
    """The caption printed under the figure: what each panel measures."""
    return (f"Left: {bug['processes']} real processes (gloo), one prompt's group of {bug['group_size']} split over them: the "
            "share of distinct completions per group, the share of groups whose rewards have zero std (no GRPO signal), "
            "and how often rank 1's completion equals rank 0's in the same slot. Right: distinct completions per group "
            f"when the group is split over 1–{max(r['world_size'] for r in rows)} simulated ranks; the dotted line is the most "
            "that identical seeds allow (group size / ranks).")


# ---- explorer ------------------------------------------------------------------------------------
def world_size_explorer(rows: list[dict]) -> Explorer:
    """A slider over the world sizes of ``world_size_sweep``'s rows: distinct completions per group, both seedings,
    redrawn."""
    group_size = rows[0]["group_size"]
    by_size: dict[int, dict[bool, dict]] = {}
    for row in rows:
        by_size.setdefault(row["world_size"], {})[row["device_specific"]] = row

    def draw(world_size):
        seedings = [by_size[world_size][device_specific] for device_specific in (False, True)]
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.bar(["same seed (bug)", "seed + rank (fix)"], [r["distinct_per_group"] for r in seedings],
               color=[plots.BUG_COLOR, plots.FIX_COLOR])
        ax.axhline(group_size, color=plots.NEUTRAL_COLOR, ls=":", label=f"group size {group_size}")
        ax.set_ylabel("distinct completions per group")
        plots.legend_outside(ax, "right")
        return {"world_size": world_size, "rows": seedings}

    sizes = sorted(by_size)
    slider = widgets.SelectionSlider(options=sizes, value=sizes[min(1, len(sizes) - 1)], description="ranks")
    return Explorer({"world_size": slider}, draw, title="P32: one prompt's group split over ranks")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(bug: dict, fix: dict, rows: list[dict]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 32."""
    reproduced, fixed = verdict(bug, fix)
    return dict(
        notebook="32_same_seed_every_rank", reproduced=reproduced, fixed=fixed,
        metrics={"processes": {"same_seed": bug, "seed_plus_rank": fix}, "world_size_sweep": rows},
        headline={"what": f"distinct completions per group of {bug['group_size']} over {bug['processes']} processes",
                  "unit": "completions", "bug": bug["distinct_per_group"], "fix": fix["distinct_per_group"]},
    )
