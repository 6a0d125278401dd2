"""Pitfall P31: final-logit soft-capping wrong or missing in the RL log-prob path.

Gemma 2, 3 and 4 bound their final logits: logits = c · tanh(z / c) with c = ``final_logit_softcapping``
(30). The model's own forward applies it, so the sampler and a reference scored by ``model(...)`` see
capped logits. RL trainers often skip ``model(...).logits`` and compute log-probs from the hidden states
and the LM head in chunks (to avoid the (B, T, V) logits tensor); that path must repeat the cap. In
unsloth-zoo (``chunked_hidden_states_selective_log_softmax``, fixed by PR #593, April 2026) it read
z · tanh(z / c): for |z| ≫ c tanh saturates to ±1 and the "cap" returns z itself. On a Gemma-4 model whose
raw logits reach ~124, the policy's log-probs were computed from uncapped logits while the reference's
were capped (and z · tanh(z / c) is even: a large negative logit became a large positive
one): GRPO's step-1 KL to an identical reference was ~0.24 instead of ~1e-5. Missing the cap
altogether (Keras-Hub PR #1712: ``score()`` without it; TRL PR #5691 adding it to the async GRPO path)
does the same.

The fix: c · tanh(z / c), applied after any logit scale and before the temperature, on every path. Here
the tiny Gemma-2-style model's LM head is rescaled so its raw logits have a chosen spread (a random
model's are far below the cap, a real Gemma's reach 4c), and the step-0 KL between the model's own capped logits (the
reference) and the hidden-state path with each cap (the policy, identical weights) is measured. The path is found
generically (``get_decoder()`` → ``get_output_embeddings()``), and the cap is read from the config: a checkpoint with
none (``final_logit_softcapping`` absent or None: GPT-2, Qwen2, Llama) has nothing to cap, and ``not_shown`` says so.
"""

from __future__ import annotations

import copy

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch

from workbench.core import progress
from workbench.core.devices import model_device
from workbench.tasks import encode_prompts
from workbench.viz import plots
from workbench.viz.explorer import Explorer
from workbench.viz.plots import draw_floor

CAP_MODES = ("c·tanh(z/c)", "z·tanh(z/c)", "none")  # the fix; unsloth-zoo before PR #593; the cap left out


# ---- measurements --------------------------------------------------------------------------------
def final_logit_cap(model) -> float | None:
    """The checkpoint's final-logit soft-cap c (``final_logit_softcapping`` of its text config); None: no cap."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None and not cap > 0:
        raise ValueError(f"final_logit_softcapping={cap!r} in the config of {type(model).__name__}: a cap must be > 0 "
                         "(None means no cap); fix config.json")
    return None if cap is None else float(cap)


def output_head(model):
    """The LM head: the module that turns the last hidden states into raw logits (``get_output_embeddings()``)."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None): "
                         "load a causal-LM checkpoint (…ForCausalLM)")
    return head


def last_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder stack's final hidden states (after its final norm), as the model's own forward feeds its LM head."""
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def softcap(logits: torch.Tensor, cap: float | None, mode: str = "c·tanh(z/c)") -> torch.Tensor:
    """The final-logit soft-cap of the RL log-prob path: ``mode`` is the switch (the first of ``CAP_MODES`` is the fix)."""
    if mode not in CAP_MODES:
        raise ValueError(f"mode={mode!r}; use one of {CAP_MODES} ({CAP_MODES[0]!r} is the fix)")
    if cap is None or mode == "none":
        return logits
    return (cap if mode == "c·tanh(z/c)" else logits) * torch.tanh(logits / cap)


def with_logit_spread(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, spread: float):
    """A copy of ``model`` whose LM head is rescaled so the raw logits on ``input_ids`` have std ``spread``; a head tied
    to the input embeddings is untied first, so that only the logits are rescaled."""
    scaled = copy.deepcopy(model)
    head = output_head(scaled)
    with torch.no_grad():
        if head.weight is scaled.get_input_embeddings().weight:
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
        raw = head(last_hidden_states(scaled, input_ids, attention_mask))
        head.weight.mul_(spread / float(raw[attention_mask.bool()].std()))
    return scaled


@torch.no_grad()
def step0_kl(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, mode: str, *, seed: int = 0) -> dict:
    """The reference: ``model(...)``'s own (capped) logits. The policy: the same weights, log-probs from the hidden
    states through the LM head and ``softcap(mode)``. Per real position: exact KL(ref ‖ policy) over the vocabulary,
    and GRPO's k3 estimate on one token sampled from the reference."""
    cap = final_logit_cap(model)
    ref = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits.float(), -1)
    raw = output_head(model)(last_hidden_states(model, input_ids, attention_mask)).float()
    pol = torch.log_softmax(softcap(raw, cap, mode), -1)
    m = attention_mask.bool()
    ref, pol = ref[m], pol[m]
    kl = (ref.exp() * (ref - pol)).sum(-1)
    # drawn on the CPU whatever the model's device: the same token for a seed on any machine's CPU generator
    token = torch.multinomial(ref.exp().cpu(), 1, generator=torch.Generator().manual_seed(seed)).to(ref.device)
    log_r = (ref.gather(-1, token) - pol.gather(-1, token)).squeeze(-1)  # log π_ref − log π
    k3 = log_r.exp() - log_r - 1
    return {"mode": mode, "cap": cap, "kl": float(kl.mean()), "k3": float(k3.mean()), "max_raw_logit": float(raw[m].abs().max()),
            "min_logprob_policy": float(pol.gather(-1, token).min()), "min_logprob_reference": float(ref.gather(-1, token).min())}


# ---- sweeps --------------------------------------------------------------------------------------
def spread_sweep(model, tokenizer, prompts: list[str], spreads: list[float], *, seed: int = 0) -> list[dict]:
    """``step0_kl`` for every cap mode at every raw-logit spread: ``[{"spread", mode: result, ...}]``. The prompts are
    encoded on the CPU and moved to the model's device."""
    device = model_device(model)
    ids, mask = (t.to(device) for t in encode_prompts(tokenizer, prompts))
    rows = []
    for spread in progress.track(spreads, "raw-logit spreads", unit="spread"):
        scaled = with_logit_spread(model, ids, mask, spread)
        rows.append({"spread": spread, **{mode: step0_kl(scaled, ids, mask, mode, seed=seed) for mode in CAP_MODES}})
    return rows


def headline_row(rows: list[dict]) -> dict:
    """The ``spread_sweep`` row at the widest spread."""
    return max(rows, key=lambda r: r["spread"])


# ---- verdict -------------------------------------------------------------------------------------
def verdict(rows: list[dict], *, kl_threshold: float = 1e-3, tolerance: float = 1e-6) -> tuple[bool, bool]:
    """(reproduced, fixed): at the widest spread the step-0 KL to an identical reference exceeds ``kl_threshold``
    with the cap missing and with z·tanh(z/c); with c·tanh(z/c) it is ≤ ``tolerance`` at every spread."""
    widest = headline_row(rows)
    reproduced = all(widest[mode]["kl"] > kl_threshold for mode in CAP_MODES[1:])
    fixed = all(r[CAP_MODES[0]]["kl"] <= tolerance for r in rows)
    return reproduced, fixed


def not_shown(widest: dict) -> str | None:
    """Why this checkpoint cannot show the pitfall, or None: a checkpoint without a final-logit soft-cap has uncapped
    logits of its own, so every cap mode's hidden-state path is its ``model(...)`` — nothing to cap, nothing to get wrong.
    ``widest``: the ``headline_row``."""
    if widest[CAP_MODES[0]]["cap"] is not None:
        return None
    worst = max(widest[mode]["kl"] for mode in CAP_MODES)
    return (f"this checkpoint has no final-logit soft-cap (final_logit_softcapping is None), so the hidden-state path gives "
            f"model(...)'s logits with every cap mode: step-0 KL to an identical reference at most {worst:.1e} nats per token "
            f"at raw logit std {widest['spread']:g} (max |z| {widest[CAP_MODES[0]]['max_raw_logit']:.1f}); nothing to cap — "
            "use a Gemma 2/3/4-style checkpoint (e.g. tiny-gemma2)")


# ---- figures -------------------------------------------------------------------------------------
MODE_STYLES = {"c·tanh(z/c)": (plots.FIX_COLOR, "s-", "c·tanh(z/c) (fix)"),
               "z·tanh(z/c)": (plots.BUG_COLOR, "o-", "z·tanh(z/c) (bug)"),
               "none": (plots.NEUTRAL_COLOR, "^--", "no cap (bug)")}


def cap_label(cap: float | None) -> str:
    """The cap c as the axes and the headline write it: its value, or "none"."""
    return "none" if cap is None else f"{cap:g}"


def plot_kl(ax, rows: list[dict], key: str = "kl", floor: float = 1e-12, *, legend: bool = True) -> None:
    """Step-0 KL to an identical reference against the raw-logit spread, per cap; an exact 0 drawn at ``floor``."""
    spreads = [r["spread"] for r in rows]
    for mode in CAP_MODES:
        color, style, label = MODE_STYLES[mode]
        ax.plot(spreads, [max(r[mode][key], floor) for r in rows], style, color=color, label=label, ms=4)
    if any(r[mode][key] <= floor for r in rows for mode in CAP_MODES):
        draw_floor(ax, floor)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("std of the raw logits z")
    ax.set_ylabel("step-0 KL (nats/token)" if key == "kl" else "step-0 k3 (GRPO)")
    plots.note_coinciding(ax, legend_kw=plots.LEGEND_BELOW if legend else None)
    if not legend and ax.get_legend():
        ax.get_legend().remove()


def plot_cap_curves(ax, cap: float | None, limit: float, *, legend: bool = True) -> None:
    """The three caps as functions of the raw logit z (without a cap, c = None: all three are z)."""
    z = torch.linspace(-limit, limit, 401)
    for mode in CAP_MODES:
        color, style, label = MODE_STYLES[mode]
        ax.plot(z, softcap(z, cap, mode), "--" if "--" in style else "-", color=color, label=label)
    if cap is not None:
        ax.axhline(cap, color=plots.NEUTRAL_COLOR, ls=":", lw=1)
        ax.axhline(-cap, color=plots.NEUTRAL_COLOR, ls=":", lw=1)
    ax.set_xlabel("raw logit z")
    ax.set_ylabel("logit after the cap")
    if legend:
        plots.legend_outside(ax)


def figure_softcapping(rows: list[dict], widest: dict):
    """The notebook's figure: the caps as functions (up to the largest raw logit of ``widest``, the ``headline_row``), the
    exact step-0 KL and GRPO's k3 against the spread; one legend below the three panels (``softcapping_note`` says the
    rest)."""
    fig, axes = plots.panel_grid(3, panel_height=3.0)
    cap = widest[CAP_MODES[0]]["cap"]
    plot_cap_curves(axes[0], cap, max(widest[CAP_MODES[0]]["max_raw_logit"], 2 * (cap or 0)), legend=False)
    plot_kl(axes[1], rows, "kl", legend=False)
    plot_kl(axes[2], rows, "k3", legend=False)
    plots.figure_legend(fig, axes[0], ncol=3)
    return fig


# ---- printers ------------------------------------------------------------------------------------
def sweep_lines(rows: list[dict]) -> str:
    return "\n".join(f"raw logit std {r['spread']:g} (max |z| {r[CAP_MODES[0]]['max_raw_logit']:.1f}): "
                     + "; ".join(f"{mode} KL {r[mode]['kl']:.2e}, k3 {r[mode]['k3']:.2e}, min log p {r[mode]['min_logprob_policy']:.1f}"
                                 for mode in CAP_MODES) for r in rows)


def headline_sentence(rows: list[dict], widest: dict) -> str:
    """The step-0 KL per cap mode at the widest spread (``widest``: the ``headline_row``), and the verdict's reading."""
    reproduced, fixed = verdict(rows)
    bug, fix = widest[CAP_MODES[1]], widest[CAP_MODES[0]]
    if bug["cap"] is None:
        return (f"this checkpoint has no final-logit soft-cap: with raw logits up to {bug['max_raw_logit']:.1f} every path gives "
                f"model(...)'s logits (step-0 KL {max(widest[m]['kl'] for m in CAP_MODES):.1e}); nothing to cap")
    if not reproduced:
        return (f"raw logits up to {bug['max_raw_logit']:.1f} stay below the cap's knee: every path agrees here (KL ≤ 1e-3); "
                "widen the spread")
    return (f"raw logits up to {bug['max_raw_logit']:.1f} (cap {bug['cap']:g}): step-0 KL to an identical reference {bug['kl']:.3g} with "
            f"z·tanh(z/c), {widest['none']['kl']:.3g} with no cap, {fix['kl']:.1e} with c·tanh(z/c)"
            + ("." if fixed else " — the fixed path is not exact here (above 1e-6)."))


def softcapping_note(rows: list[dict]) -> str:
    """The caption printed under the figure: what each panel shows, the cap, and where an exact zero is drawn."""
    cap = rows[0][CAP_MODES[0]]["cap"]
    zero = any(r[CAP_MODES[0]][key] == 0 for r in rows for key in ("kl", "k3"))
    return ("Left: what each cap makes of a raw logit z" + (f" (dotted: ±c = ±{cap:g})" if cap is not None else " (no cap on "
            "this checkpoint: every mode returns z)") + ". Middle, right: the exact step-0 KL(ref ‖ policy) and GRPO's k3 "
            "estimator between model(...)'s own logits and the hidden-state path with each cap, identical weights, against "
            "the spread of the raw logits" + ("; an exact 0 is drawn on the dotted line at 1e-12." if zero else ".")
            + " z·tanh(z/c) is unsloth-zoo's before PR #593.")


# ---- explorer ------------------------------------------------------------------------------------
GEMMA_CAP = 30.0  # Gemma 2/3/4's final_logit_softcapping: what the explorer shows for a checkpoint without a cap


def softcap_explorer(cap: float | None = GEMMA_CAP) -> Explorer:
    """Sliders for the cap c and a range of raw logits: the three caps redrawn (from Gemma's c when ``cap`` is None)."""
    cap = GEMMA_CAP if cap is None else cap

    def draw(c, limit):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        plot_cap_curves(ax, c, limit)
        return {mode: float(softcap(torch.tensor(limit), c, mode)) for mode in CAP_MODES}

    return Explorer({"c": widgets.FloatSlider(value=cap, min=5, max=60, step=1, description="cap c"),
                     "limit": widgets.FloatSlider(value=4 * cap, min=5, max=250, step=5, description="max |z|")},
                    draw, title="P31: what each cap makes of a raw logit")


# ---- metrics -------------------------------------------------------------------------------------
def metrics(rows: list[dict], widest: dict) -> dict:
    """``notebook_api.write_metrics``'s keyword arguments for notebook 31 (``widest``: the ``headline_row``)."""
    reproduced, fixed = verdict(rows)
    return dict(
        notebook="31_logit_softcapping", reproduced=reproduced, fixed=fixed, not_shown=not_shown(widest),
        metrics={"spreads": [{"spread": r["spread"], **{mode: r[mode] for mode in CAP_MODES}} for r in rows]},
        headline={"what": f"step-0 KL to an identical reference, raw logit std {widest['spread']:g}, "
                          f"cap {cap_label(widest[CAP_MODES[0]]['cap'])}",
                  "unit": "nats / token", "bug": widest[CAP_MODES[1]]["kl"], "fix": widest[CAP_MODES[0]]["kl"]},
    )
