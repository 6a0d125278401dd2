"""Pitfall P24: a reward model that pools the hidden state of the wrong token.

A decoder reward model (``*ForSequenceClassification`` in transformers) scores a text from the hidden
state of its last real token. Until PR #35911 (transformers 4.49, January 2025) the models found that
token as "the first pad − 1": ``argmax(input_ids == pad_token_id) − 1``, wrapped modulo the width.
That is the last real token only when padding is on the right and the pad token appears nowhere else:

* **pad = EOS** (the usual fallback when a tokenizer has none; #35352): the first "pad" is the text's
  own EOS, so the head pools the token *before* it; under **left padding** the first pad is position
  0, −1 wraps to the last column and the same text is pooled at its EOS — its score depends on the
  batch it sits in (#35909, #30004).
* **an EOS inside the text** (a chat template that ends the prompt with EOS) with pad = EOS: the head
  pools the end of the prompt, whatever the response says.

PR #35911 pools the **rightmost non-pad token** instead: right for every padding side, and consistent
across batches even with pad = EOS (where it pools the token before a trailing EOS). Pooling the
rightmost *attended* token (from the attention mask) is the same rule without that exception; it is the
fix measured here. Related: gpt-neox PR #1285; bloom #24265 (PR #24979) had the ``count − 1`` variant.

The reward model here is the tiny checkpoint's backbone plus a seeded linear head (the pooling, not
training, is the pitfall); forwards use position ids from the mask, so padding alone moves no hidden state.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.tasks import rl_problems
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import label_zero_bars

RULES = ("first pad − 1", "rightmost non-pad", "rightmost attended")  # the bug, PR #35911, the mask (fix)


# ---- measurements -------------------------------------------------------------------------------
def pool_index(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_id: int, rule: str) -> torch.Tensor:
    """(B,) index of the token whose hidden state the head scores."""
    width = input_ids.shape[-1]
    positions = torch.arange(width, device=input_ids.device)
    if rule == "first pad − 1":  # transformers before PR #35911
        return ((input_ids == pad_id).int().argmax(-1) - 1) % width
    if rule == "rightmost non-pad":  # PR #35911
        return (positions * (input_ids != pad_id)).argmax(-1)
    if rule == "rightmost attended":
        return (positions * attention_mask.long()).argmax(-1)
    raise ValueError(f"rule {rule!r}: use one of {RULES}")


def reward_head(model, seed: int = 0) -> torch.nn.Linear:
    """A seeded linear head hidden → 1 (a freshly initialised score head, as from_pretrained makes)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(model.config.hidden_size, 1, bias=False).to(next(model.parameters()).device)


@torch.no_grad()
def last_hidden(model, input_ids, attention_mask) -> torch.Tensor:
    """(B, T, H) last-layer hidden states, position ids from the mask."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, output_hidden_states=True).hidden_states[-1]


@torch.no_grad()
def score(model, head, input_ids, attention_mask, pad_id: int, rule: str, hidden=None) -> torch.Tensor:
    """(B,) reward: the head on the last layer's hidden state at ``pool_index`` (``hidden``: precomputed states)."""
    hidden = last_hidden(model, input_ids, attention_mask) if hidden is None else hidden
    index = pool_index(input_ids, attention_mask, pad_id, rule)
    return head(hidden[torch.arange(input_ids.shape[0]), index]).squeeze(-1).float()


def texts_ids(tokenizer, n: int, eos_inside: bool = False) -> list[list[int]]:
    """Token ids of ``n`` arithmetic prompt + answer texts, each ending with EOS; ``eos_inside``: an EOS
    also closes the prompt (a chat template's end of turn)."""
    eos = tokenizer.eos_token_id
    out = []
    for p in rl_problems(n):
        prompt = tokenizer.encode(p.prompt, add_special_tokens=False)
        answer = tokenizer.encode(p.answer, add_special_tokens=False)
        out.append(prompt + ([eos] if eos_inside else []) + answer + [eos])
    return out


def pad_batch(rows: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` padded with ``pad_id`` on ``side``."""
    width = max(len(r) for r in rows)
    ids, mask = [], []
    for r in rows:
        fill = width - len(r)
        ids.append([pad_id] * fill + r if side == "left" else r + [pad_id] * fill)
        mask.append([0] * fill + [1] * len(r) if side == "left" else [1] * len(r) + [0] * fill)
    return torch.tensor(ids), torch.tensor(mask)


class Scorer:
    """The reward model on a fixed set of texts, each text's hidden states computed once alone and once
    per padded batch (the rules only pick a different row of them)."""

    def __init__(self, model, head, rows: list[list[int]]):
        self.model, self.head, self.rows = model, head, rows
        self.device = next(model.parameters()).device
        self.alone_ids = [torch.tensor([r], device=self.device) for r in rows]
        self.alone_hidden = [last_hidden(model, ids, torch.ones_like(ids)) for ids in self.alone_ids]
        self.batches: dict = {}

    def batch(self, pad_id: int, side: str):
        if (pad_id, side) not in self.batches:
            ids, mask = (t.to(self.device) for t in pad_batch(self.rows, pad_id, side))
            self.batches[pad_id, side] = (ids, mask, last_hidden(self.model, ids, mask))
        return self.batches[pad_id, side]

    def measure(self, pad_id: int, side: str, rule: str) -> dict:
        """Pooled index − last real index per text (in the batch), and |score alone − score in the batch|."""
        ids, mask, hidden = self.batch(pad_id, side)
        batched = score(self.model, self.head, ids, mask, pad_id, rule, hidden)
        alone = torch.cat([score(self.model, self.head, a, torch.ones_like(a), pad_id, rule, h)
                           for a, h in zip(self.alone_ids, self.alone_hidden, strict=True)])
        offsets = (pool_index(ids, mask, pad_id, rule) - pool_index(ids, mask, pad_id, "rightmost attended")).cpu()
        delta = (batched - alone).abs().cpu()
        return {"mean_abs_offset": float(offsets.abs().float().mean()), "wrong_token_share": float((offsets != 0).float().mean()),
                "max_abs_score_delta": float(delta.max()), "changed_share": float((delta > 1e-4).float().mean())}


# ---- sweeps -------------------------------------------------------------------------------------
SCENARIOS = (("right", False), ("left", False), ("right", True), ("left", True))  # (padding side, pad = EOS)


def sweep(model, tokenizer, n_texts: int, seed: int = 0, eos_inside: bool = False) -> list[dict]:
    """Every (padding side, pad = EOS) scenario × every rule on ``n_texts`` texts."""
    scorer = Scorer(model, reward_head(model, seed), texts_ids(tokenizer, n_texts, eos_inside))
    out = []
    for side, pad_is_eos in SCENARIOS:
        pad_id = tokenizer.eos_token_id if pad_is_eos else tokenizer.pad_token_id
        for rule in RULES:
            out.append({"side": side, "pad_is_eos": pad_is_eos, "eos_inside": eos_inside, "rule": rule,
                        **scorer.measure(pad_id, side, rule)})
    return out


def scenario_row(rows: list[dict], side: str, pad_is_eos: bool, rule: str) -> dict:
    """The ``sweep`` row of one (padding side, pad = EOS) scenario under ``rule``."""
    return next(r for r in rows if r["side"] == side and r["pad_is_eos"] == pad_is_eos and r["rule"] == rule)


def headline_rows(rows: list[dict], inside: list[dict]) -> tuple[dict, dict, dict]:
    """The rows the headline reads: left padding with pad = EOS under 'first pad − 1' (bug) and under the rightmost
    attended token (fix), and 'first pad − 1' with an EOS inside the text (the worst case)."""
    return (scenario_row(rows, "left", True, RULES[0]), scenario_row(rows, "left", True, RULES[2]),
            scenario_row(inside, "left", True, RULES[0]))


# ---- verdict ------------------------------------------------------------------------------------
def verdict(rows: list[dict], inside: list[dict], *, tolerance: float = 1e-4) -> tuple[bool, bool]:
    """(reproduced, fixed) from ``sweep`` rows without and with an EOS inside the texts.

    Reproduced: with pad = EOS and left padding the bug changes a text's score by its batch (> 10 ×
    ``tolerance``), and with an EOS inside the text it pools another token; fixed: the rightmost attended
    token is the last real token and no score moves (≤ ``tolerance``) in every scenario.
    """
    bug = headline_rows(rows, inside)[0]
    reproduced = bug["max_abs_score_delta"] > 10 * tolerance and scenario_row(inside, "right", True, RULES[0])["wrong_token_share"] > 0
    fixes = [r for r in rows + inside if r["rule"] == RULES[2]]
    fixed = all(r["wrong_token_share"] == 0 and r["max_abs_score_delta"] <= tolerance for r in fixes)
    return reproduced, fixed


# ---- figures ------------------------------------------------------------------------------------
RULE_COLORS = {RULES[0]: plots.BUG_COLOR, RULES[1]: plots.NEUTRAL_COLOR, RULES[2]: plots.FIX_COLOR}
RULE_LABELS = {RULES[0]: "first pad − 1 (bug)", RULES[1]: "rightmost non-pad (PR #35911)", RULES[2]: "rightmost attended (fix)"}
PANELS = (("max_abs_score_delta", "max |Δ score|"), ("wrong_token_share", "share pooled off"), ("mean_abs_offset", "mean |offset|"))


def shown_scenarios(rows: list[dict], inside: list[dict]) -> list[tuple[str, list[dict]]]:
    """``(tick label, the rows of that scenario under each rule)`` for the figure: the four (padding side, pad = EOS)
    scenarios without an EOS inside the texts, then the two with pad = EOS and an EOS closing the prompt (with pad ≠ EOS
    an EOS inside the text is an ordinary token: ``pooling_note`` says what those rows measured)."""
    out = []
    for source, scenarios in ((rows, SCENARIOS), (inside, [s for s in SCENARIOS if s[1]])):
        for side, pad_is_eos in scenarios:
            label = f"{side} pad, pad {'=' if pad_is_eos else '≠'} EOS" + ("\n+ EOS after the prompt" if source is inside else "")
            out.append((label, [scenario_row(source, side, pad_is_eos, rule) for rule in RULES]))
    return out


def plot_by_scenario(ax, rows: list[dict], inside: list[dict], key: str, ylabel: str) -> None:
    """``key`` per rule (bars, bug / PR #35911 / fix) for each scenario of ``shown_scenarios``; a bar of height 0 (below
    1e-4 for a score change) is labelled 0."""
    scenarios = shown_scenarios(rows, inside)
    for j, rule in enumerate(RULES):
        values = [measured[j][key] for _, measured in scenarios]
        bars = ax.bar([i + (j - 1) * 0.27 for i in range(len(values))], values, 0.27, color=RULE_COLORS[rule], label=RULE_LABELS[rule])
        label_zero_bars(ax, bars, tol=1e-4 if "delta" in key else 0.0)
    ax.axvline(3.5, color=plots.NEUTRAL_COLOR, ls="--", lw=1)
    ax.set_xticks(range(len(scenarios)), [label for label, _ in scenarios], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.15 * max([m[key] for _, measured in scenarios for m in measured] + [1e-3]))


def figure_pooling(rows: list[dict], inside: list[dict]):
    """The notebook's figure: |score alone − in a batch|, the share of texts pooled at another token, and how far from
    the last real token the head reads, one panel under the other over the same scenarios (``shown_scenarios``), one
    legend above them (``pooling_note`` is the caption)."""
    fig, axes = plots.panel_grid(len(PANELS), columns=1, panel_height=1.9, sharex=True)
    for ax, (key, ylabel) in zip(axes, PANELS, strict=True):
        plot_by_scenario(ax, rows, inside, key, ylabel)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=9)
    fig.tight_layout()
    return fig


# ---- printers -----------------------------------------------------------------------------------
def pooling_lines(rows: list[dict], inside: list[dict]) -> str:
    return "\n".join(f"{'EOS in text, ' if r['eos_inside'] else ''}{r['side']} padding, pad {'=' if r['pad_is_eos'] else '≠'} EOS, "
                     f"{r['rule']}: {r['wrong_token_share']:.0%} pooled off the last real token (mean |offset| "
                     f"{r['mean_abs_offset']:.2f}), max |Δ score| {r['max_abs_score_delta']:.2e}" for r in rows + inside)


def pooling_note(rows: list[dict], inside: list[dict]) -> str:
    """The caption printed under ``figure_pooling``: what each row of panels measures and which scenarios it leaves out."""
    left_out = [r for r in inside if not r["pad_is_eos"]]
    quiet = all(r["wrong_token_share"] == 0 and r["max_abs_score_delta"] <= 1e-4 for r in left_out)
    return ("Top: the largest |score alone − score in the padded batch| over the texts; middle: the share of texts whose "
            "pooled token is not the last real one; bottom: the mean |pooled index − last real index| in tokens. A bar "
            "labelled 0 is exactly 0 (a score change: below 1e-4, the float noise of a batched forward). Right of the dashed "
            "line an EOS also closes each prompt (a chat template's end of turn); with pad ≠ EOS that EOS is an ordinary "
            "token, " + ("and those scenarios (not drawn) pool every text at its last real token, its score moving by less than 1e-4."
                         if quiet else "and those scenarios (not drawn) are printed below."))


def headline_sentence(rows: list[dict], inside: list[dict], head: tuple[dict, dict, dict]) -> str:
    """The score shifts of the ``headline_rows`` ``head`` (bug, fix, worst case), and the verdict's reading."""
    bug, fix, worst = head
    reproduced, fixed = verdict(rows, inside)
    outcome = (("the bug is reproduced" if reproduced else "the bug did not show")
               + (" and the fix holds in every scenario." if fixed else ", and the fix does not hold everywhere."))
    return (f"Left padding with pad = EOS, texts without an EOS inside: a text's score moves by up to "
            f"{bug['max_abs_score_delta']:.3g} with its batch under 'first pad − 1' ({bug['changed_share']:.0%} of texts), "
            f"{fix['max_abs_score_delta']:.1e} pooling the rightmost attended token; with an EOS closing the prompt it moves by "
            f"up to {worst['max_abs_score_delta']:.3g} ({worst['changed_share']:.0%} of texts); {outcome}")


# ---- explorer -----------------------------------------------------------------------------------
def pooling_explorer(model, tokenizer, n_texts: int = 8) -> Explorer:
    """Controls for padding side, pad = EOS and an EOS in the text: each rule's score shift and wrong-token share."""

    def draw(side, pad_is_eos, eos_inside):
        scorer = Scorer(model, reward_head(model), texts_ids(tokenizer, n_texts, eos_inside=eos_inside))
        pad_id = tokenizer.eos_token_id if pad_is_eos else tokenizer.pad_token_id
        result = {rule: scorer.measure(pad_id, side, rule) for rule in RULES}
        fig, ax = plt.subplots(figsize=(6, 3.2))
        bars = ax.bar(list(RULES), [result[r]["max_abs_score_delta"] for r in RULES], color=[RULE_COLORS[r] for r in RULES])
        label_zero_bars(ax, bars, tol=1e-4)
        ax.set_ylim(0, max(2e-4, 1.1 * max(result[r]["max_abs_score_delta"] for r in RULES)))  # float noise stays flat
        ax.set_ylabel("max |Δ score|")
        ax.set_title("score alone vs in the padded batch (0: below 1e-4)", fontsize=9)
        return result

    controls = {"side": widgets.Dropdown(options=["left", "right"], value="left", description="padding"),
                "pad_is_eos": widgets.Checkbox(value=True, description="pad = EOS"),
                "eos_inside": widgets.Checkbox(value=False, description="EOS after the prompt")}
    return Explorer(controls, draw, title="P24: reward-model pooling rules")


# ---- metrics ------------------------------------------------------------------------------------
def metrics(rows: list[dict], inside: list[dict], head: tuple[dict, dict, dict]) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 24 (``head``: ``headline_rows(rows, inside)``)."""
    reproduced, fixed = verdict(rows, inside)
    bug, fix, _ = head
    return dict(
        notebook="24_reward_model_pooling", reproduced=reproduced, fixed=fixed,
        metrics={"scenarios": rows, "eos_inside": inside},
        headline={"what": "max |score alone − score in a left-padded batch|, pad = EOS", "unit": "reward",
                  "bug": bug["max_abs_score_delta"], "fix": fix["max_abs_score_delta"]},
    )
