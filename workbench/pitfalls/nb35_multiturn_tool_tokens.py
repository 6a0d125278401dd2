"""Pitfall P35: tool tokens inside a multi-turn response break reward-to-go and response lengths.

In agentic RL a response interleaves the model's turns with tool (environment) observations; the
observation tokens are in the sequence but masked out of the loss (``response_mask``/``action_mask`` 0).
Code written for single-turn responses reads "mask 0" as "padding after EOS", which is wrong inside a
multi-turn response, in two places reported in 2026:

**Reward-to-go reset at a tool token** (verl PR #6376, again #7278 → PR #7280): REINFORCE++'s right-to-left
scan ``running = r_t + γ · running`` zeroed ``running`` at every masked position, so the outcome reward
never reached the turns before the last tool observation: rewards [0, 0, 1], mask [1, 0, 1], γ = 0.5 gave
returns [0, 0.5, 1] instead of [0.5, 1, 1]. The fix: update the running return on model tokens only and
carry it unchanged across observation tokens; trailing padding stays 0 because the scan starts at 0.

**Overlong penalty counting tool tokens** (OpenRLHF #1243 → PR #1252): the response length was the span
from the first to the last action token, tool tokens in the gaps included, so DAPO's soft overlong
penalty punished responses whose *generated* tokens were well under the limit, the more the longer the
tool outputs (discouraging tool use). The fix: length = ``action_mask.sum()``.

The reference for both fixes is the same trajectory with its tool tokens removed (the compact, model-only
sequence): the fixed functions on the full sequence must give its numbers exactly.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.viz import plots
from workbench.viz.explorer import Explorer


# ---- measurements --------------------------------------------------------------------------------
def trajectory(turn_lengths: list[int], tool_lengths: list[int], padding: int = 0, reward: float = 1.0) -> dict:
    """A multi-turn response: model turns (mask 1) separated by tool observations (mask 0), then ``padding``
    (mask 0); the outcome ``reward`` sits on the last model token. ``len(tool_lengths) == len(turn_lengths) − 1``."""
    if len(tool_lengths) != len(turn_lengths) - 1:
        raise ValueError(f"{len(turn_lengths)} turns need {len(turn_lengths) - 1} tool observations between them, got {len(tool_lengths)}")
    mask, turn = [], []
    for i, n in enumerate(turn_lengths):
        mask += [1] * n
        turn += [i] * n
        if i < len(tool_lengths):
            mask += [0] * tool_lengths[i]
            turn += [-1] * tool_lengths[i]
    mask += [0] * padding
    turn += [-1] * padding
    mask_t = torch.tensor(mask, dtype=torch.float32)
    rewards = torch.zeros_like(mask_t)
    rewards[int(mask_t.nonzero().max())] = reward
    return {"mask": mask_t, "rewards": rewards, "turn": torch.tensor(turn)}


def compact(traj: dict) -> dict:
    """The same trajectory with every masked token removed: the model-only sequence, the reference."""
    keep = traj["mask"].bool()
    return {"mask": traj["mask"][keep], "rewards": traj["rewards"][keep], "turn": traj["turn"][keep]}


def reward_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, reset_at_masked: bool = False) -> torch.Tensor:
    """Discounted reward-to-go by a right-to-left scan of one response.

    ``reset_at_masked=True`` is the bug (verl before PR #6376): the running return is zeroed after every
    masked token, tool observations included. The fix (default) updates it on model tokens only and carries
    it across masked ones; masked positions report the carried value (the loss masks them anyway).
    """
    returns = torch.zeros_like(rewards)
    running = torch.zeros(())
    for t in reversed(range(rewards.shape[-1])):
        if reset_at_masked:
            running = rewards[t] + gamma * running
            returns[t] = running
            running = running * mask[t]
        else:
            if mask[t]:
                running = rewards[t] + gamma * running
            returns[t] = running
    return returns


def response_length(mask: torch.Tensor, span: bool = False) -> int:
    """Generated tokens: ``mask.sum()`` (the fix), or the span first → last action token (the bug, OpenRLHF
    before PR #1252: tool tokens between turns counted)."""
    positions = mask.nonzero().flatten()
    if not len(positions):
        return 0
    return int(positions[-1] - positions[0] + 1) if span else int(mask.sum())


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong penalty: 0 up to max_length − buffer, then linearly down to −factor at max_length."""
    exceed = length - (max_length - buffer)
    return -min(exceed, buffer) / buffer * factor if exceed > 0 else 0.0


def returns_case(turn_lengths: list[int], tool_lengths: list[int], gamma: float, padding: int = 2) -> dict:
    """Both scans on one trajectory against the compact reference: per-token returns on model tokens, the first
    turn's return, and the share of model tokens whose return lost the outcome reward (0 where the reference is not)."""
    traj = trajectory(turn_lengths, tool_lengths, padding)
    model_only = compact(traj)
    ref = reward_to_go(model_only["rewards"], model_only["mask"], gamma)
    model_tokens = traj["mask"].bool()
    out = {"turns": len(turn_lengths), "gamma": gamma, "reference": ref.tolist()}
    returns = {}
    for name, reset in (("bug", True), ("fix", False)):
        returns[name] = reward_to_go(traj["rewards"], traj["mask"], gamma, reset_at_masked=reset)
        ret = returns[name][model_tokens]
        out[name] = ret.tolist()
        out[f"first_turn_{name}"] = float(ret[0])
        out[f"lost_{name}"] = float(((ret == 0) & (ref != 0)).float().mean())
        out[f"error_{name}"] = float((ret - ref).abs().max())
    out["padding_returns_fix"] = float(returns["fix"][-padding:].abs().max()) if padding else 0.0
    return out


# ---- sweeps --------------------------------------------------------------------------------------
def turns_sweep(max_turns: int, turn_length: int, tool_length: int, gamma: float) -> list[dict]:
    """``returns_case`` for 1 … ``max_turns`` turns of ``turn_length`` tokens, ``tool_length`` tool tokens between."""
    return [returns_case([turn_length] * n, [tool_length] * (n - 1), gamma) for n in range(1, max_turns + 1)]


def penalty_sweep(tool_lengths: list[int], turn_lengths: list[int], max_length: int, buffer: int) -> list[dict]:
    """For each tool-observation length (between every pair of turns): the length and overlong penalty measured
    by span (bug) and by sum (fix), and the compact reference's."""
    rows = []
    for tool in tool_lengths:
        traj = trajectory(turn_lengths, [tool] * (len(turn_lengths) - 1))
        lengths = {"bug": response_length(traj["mask"], span=True), "fix": response_length(traj["mask"]),
                   "reference": len(compact(traj)["mask"])}
        rows.append({"tool_length": tool, "length": lengths,
                     "penalty": {k: overlong_penalty(v, max_length, buffer) for k, v in lengths.items()}})
    return rows


def headline_rows(turn_rows: list[dict], penalty_rows: list[dict]) -> tuple[dict, dict]:
    """The multi-turn row with the most turns and the penalty row with the longest tool output."""
    return turn_rows[-1], max(penalty_rows, key=lambda r: r["tool_length"])


# ---- verdict -------------------------------------------------------------------------------------
def verdict(returns_row: dict, penalty_row: dict, *, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed) from a ``returns_case`` with ≥ 2 turns and a ``penalty_sweep`` row.

    Reproduced: the bug's first-turn return is 0 where the reference's is not, and the span length draws a
    penalty the model-only length does not. Fixed: the fixed scan equals the compact reference on every model
    token (within ``tolerance``), padding keeps return 0, and the sum length and penalty equal the reference's.
    """
    reproduced = (returns_row["first_turn_bug"] == 0 and returns_row["reference"][0] != 0
                  and penalty_row["penalty"]["bug"] < penalty_row["penalty"]["reference"])
    fixed = (returns_row["error_fix"] < tolerance and returns_row["padding_returns_fix"] == 0
             and penalty_row["length"]["fix"] == penalty_row["length"]["reference"]
             and penalty_row["penalty"]["fix"] == penalty_row["penalty"]["reference"])
    return reproduced, fixed


# ---- figures -------------------------------------------------------------------------------------
def plot_returns(ax, row: dict) -> None:
    """Reward-to-go of each model token of one trajectory: reset at tool tokens (bug), carried (fix), compact reference."""
    x = range(len(row["reference"]))
    every = max(1, len(x) // 12)  # a marker on every token would pave the lines over
    ax.plot(x, row["reference"], ":", color=plots.NEUTRAL_COLOR, lw=3, label="no tool tokens (reference)")
    ax.plot(x, row["bug"], "o-", color=plots.BUG_COLOR, ms=4, markevery=every, label="reset (bug)")
    ax.plot(x, row["fix"], "s--", color=plots.FIX_COLOR, ms=3, markevery=every, label="carried (fix)")
    ax.set_xlabel("model token index")
    ax.set_ylabel(f"reward-to-go (γ = {row['gamma']:g})")
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_penalty(ax, rows: list[dict], max_length: int, buffer: int) -> None:
    """Overlong penalty vs the tool-output length: span (bug) vs sum (fix) of the action mask."""
    x = [r["tool_length"] for r in rows]
    ax.plot(x, [r["penalty"]["bug"] for r in rows], "o-", color=plots.BUG_COLOR, label="span (bug)")
    ax.plot(x, [r["penalty"]["fix"] for r in rows], "s-", color=plots.FIX_COLOR, label="mask sum (fix)")
    ax.set_xlabel("tool tokens per gap")
    ax.set_ylabel("overlong penalty")
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def plot_lost(ax, rows: list[dict]) -> None:
    """Share of model tokens whose return lost the outcome reward, vs the number of turns."""
    x = [r["turns"] for r in rows]
    ax.plot(x, [r["lost_bug"] for r in rows], "o-", color=plots.BUG_COLOR, label="reset (bug)")
    ax.plot(x, [r["lost_fix"] for r in rows], "s-", color=plots.FIX_COLOR, label="carried (fix)")
    ax.set_xlabel("turns")
    ax.set_ylabel("share of tokens with return 0")
    ax.set_ylim(-0.05, 1.05)
    plots.integer_axis(ax.xaxis)
    plots.note_coinciding(ax, legend_kw=plots.legend_outside(ax))


def figure_tool_tokens(turn_rows: list[dict], penalty_rows: list[dict], head: tuple[dict, dict], max_length: int, buffer: int):
    """The notebook's figure: the returns of the headline trajectory (the first of ``headline_rows``' ``head``), the lost
    share vs turns, the penalty vs tool length."""
    fig, axes = plots.panel_grid(3, panel_height=3.4)
    plot_returns(axes[0], head[0])
    plot_lost(axes[1], turn_rows)
    plot_penalty(axes[2], penalty_rows, max_length, buffer)
    fig.tight_layout()
    return fig


# ---- printers ------------------------------------------------------------------------------------
def example_line(gamma: float = 0.5) -> str:
    """verl PR #6376's example, recomputed: rewards [0, 0, 1], mask [1, 0, 1]."""
    rewards, mask = torch.tensor([0.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 1.0])
    bug = reward_to_go(rewards, mask, gamma, reset_at_masked=True)
    fix = reward_to_go(rewards, mask, gamma)
    return f"rewards [0, 0, 1], mask [1, 0, 1], γ = {gamma:g}: returns {bug.tolist()} reset at the tool token, {fix.tolist()} carried"


def returns_lines(rows: list[dict]) -> str:
    return "\n".join(f"{r['turns']} turns: first-turn return {r['first_turn_bug']:.3g} (bug) vs {r['first_turn_fix']:.3g} (fix, "
                     f"reference {r['reference'][0]:.3g}); {r['lost_bug']:.0%} of model tokens lose the reward with the bug" for r in rows)


def penalty_lines(rows: list[dict]) -> str:
    return "\n".join(f"tool tokens {r['tool_length']:>3} between turns: length span {r['length']['bug']} / sum {r['length']['fix']} → "
                     f"penalty {r['penalty']['bug']:.3f} / {r['penalty']['fix']:.3f}" for r in rows)


def headline_sentence(head: tuple[dict, dict]) -> str:
    """The first-turn return and the overlong penalty of the ``headline_rows``, and the verdict's reading."""
    returns_row, penalty_row = head
    reproduced, fixed = verdict(returns_row, penalty_row)
    return (f"first-turn reward-to-go in a {returns_row['turns']}-turn response: {returns_row['first_turn_bug']:.3g} → "
            f"{returns_row['first_turn_fix']:.3g}; overlong penalty with {penalty_row['tool_length']} tool tokens per gap: "
            f"{penalty_row['penalty']['bug']:.3f} → {penalty_row['penalty']['fix']:.3f}; "
            + ("tool tokens read as padding are the bug" if reproduced else "the tool tokens change nothing at these settings")
            + ("; the fixed scan and length match the model-only sequence." if fixed else "."))


def tool_tokens_note(penalty_rows: list[dict], head: tuple[dict, dict], max_length: int, buffer: int) -> str:
    """The caption printed under the figure: what each panel shows and the settings behind it."""
    returns_row = head[0]
    return (f"Left: reward-to-go of each model token of a {returns_row['turns']}-turn response (tool tokens left off the "
            "axis), reset at every tool token (bug) or carried across them (fix), against the same response without tool "
            "tokens. Middle: the share of model tokens whose return is 0 although the reference's is not, per number of "
            f"turns. Right: DAPO's overlong penalty for {penalty_rows[0]['length']['reference']} generated tokens (limit "
            f"{max_length}, buffer {buffer}) when the length is the action mask's span (bug) or its sum (fix).")


# ---- explorer ------------------------------------------------------------------------------------
def tool_length_explorer(turn_lengths: list[int], max_length: int, buffer: int, gamma: float = 1.0) -> Explorer:
    """A slider for the tool-output length: returns and penalty of one trajectory, bug vs fix, redrawn."""

    def draw(tool_length):
        row = returns_case(turn_lengths, [tool_length] * (len(turn_lengths) - 1), gamma)
        penalty = penalty_sweep([tool_length], turn_lengths, max_length, buffer)[0]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        plot_returns(ax, row)
        ax.set_title(f"overlong penalty: span {penalty['penalty']['bug']:.2f}, sum {penalty['penalty']['fix']:.2f}", fontsize=9)
        return {"returns": row, "penalty": penalty}

    slider = widgets.IntSlider(value=8, min=0, max=4 * buffer, description="tool tokens")
    return Explorer({"tool_length": slider}, draw, title="P35: tool tokens inside a multi-turn response")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(turn_rows: list[dict], penalty_rows: list[dict], head: tuple[dict, dict]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 35 (``head``: ``headline_rows``)."""
    returns_row, penalty_row = head
    reproduced, fixed = verdict(returns_row, penalty_row)
    every = all(r["error_fix"] < 1e-6 for r in turn_rows) and all(r["length"]["fix"] == r["length"]["reference"] for r in penalty_rows)
    return dict(
        notebook="35_multiturn_tool_tokens", reproduced=reproduced, fixed=fixed and every,
        metrics={"returns_by_turns": turn_rows, "overlong_by_tool_length": penalty_rows},
        headline={"what": f"first-turn reward-to-go, {returns_row['turns']}-turn response (reference {returns_row['reference'][0]:.3g})",
                  "unit": "return", "bug": returns_row["first_turn_bug"], "fix": returns_row["first_turn_fix"]},
    )
