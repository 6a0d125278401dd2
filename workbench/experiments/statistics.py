"""Statistics that turn multi-seed runs into a conclusion: effects against seed noise, Student-t thresholds.

Runs are plain data, ``{label: [history of seed 0, history of seed 1, …]}`` with a history a list of
per-step records (``experiments.comparison.train_variants``). ``effect`` compares two variants' final
values and says whether the gap is larger than the noise:

* with several seeds the noise is the standard error of the per-seed differences (paired seeds:
  both variants see the same prompts and initial samples), the threshold the 95 % Student-t value;
* with one seed the only noise estimate is the step-to-step spread of the two runs' difference over
  the final steps (a conservative stand-in), and the sentence says so ("one seed").

``gain`` says whether a variant's held-out accuracy rose by more than the seed noise, ``learnt_gap``
which part of a gap training added, ``drift`` how far a metric moved. The conclusion is chosen by the
numbers (``Effect.larger_than_noise``), never typed in a notebook.

Every ``Effect`` carries its power: ``mde``, the minimum detectable effect (threshold × noise, the
smallest |effect| these seeds could call larger), so a null reads "no effect larger than X could be
seen" rather than "nothing". ``prediction`` turns the effect a pitfall's mechanism predicts into the
``metrics["prediction"]`` record of a training notebook, which the report's "Does it
matter?" table reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.core.errors import ParameterError
from workbench.core.jsonsafe import jsonable
from workbench.core.numbers import shown, why_undefined

# Two-sided 95 % critical values of Student's t by degrees of freedom (n seeds → n − 1): with 3 seeds an
# effect needs |mean difference| > 4.30 standard errors, not 2. Between listed values the smaller dof's
# (larger, conservative) value is used; beyond 30, the normal 1.96.
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


def t_critical(seeds: int) -> float:
    """The 95 % two-sided t critical value for the mean of ``seeds`` paired differences (n − 1 dof)."""
    dof = seeds - 1
    if dof < 1:
        return float("nan")
    if dof > 30:
        return 1.96
    return T_95[max(d for d in T_95 if d <= dof)]


def _threshold(seeds: int, factor: float | None) -> float:
    """How many standard errors an effect must exceed: ``factor`` when given, else the t critical value."""
    return factor if factor is not None else t_critical(seeds)


def tail_mean(history: list[dict], key: str, fraction: float = 0.25) -> float:
    """Mean of ``key`` over the last ``fraction`` of the steps (at least one), NaNs ignored."""
    values = np.array([h[key] for h in history if key in h], dtype=float)
    tail = values[-max(1, math.ceil(len(values) * fraction)):]
    return float(np.nanmean(tail)) if np.isfinite(tail).any() else float("nan")


@dataclass
class Effect:
    """bug − fix of one metric over the final steps (or at the first step), against the noise.

    ``mde`` (minimum detectable effect) is ``threshold × noise``: the smallest |effect| these seeds could
    call larger than the noise at that threshold (NaN without a noise estimate); computed from the
    other fields when not given, so every ``Effect`` and every ``vars(effect)`` record carries it."""

    key: str
    bug: float
    fix: float
    difference: float
    noise: float
    seeds: int
    larger_than_noise: bool
    names: tuple[str, str] = ("bug", "fix")
    threshold: float = float("nan")  # how many ``noise`` units the effect had to exceed
    mde: float = float("nan")  # threshold × noise: the smallest |effect| that could be called larger

    def __post_init__(self):
        if not math.isfinite(self.mde) and self.noise != 0:  # noise 0: no spread, no detectable-effect size (NaN)
            self.mde = float(self.threshold * self.noise)

    @property
    def no_spread(self) -> bool:
        """The noise is exactly 0 (every seed gave the same difference; with one seed, the difference did not vary
        from step to step): there is nothing to test the effect against, so it is never called larger."""
        return self.noise == 0

    def sentence(self, unit: str = "") -> str:
        """One line: both sides, the effect ± noise, the threshold and the verdict; a null names the
        largest effect it rules out ("no effect larger than <mde> could be seen")."""
        unit = f" {unit}" if unit else ""
        if self.no_spread:
            source = (f"s.e. over {self.seeds} seeds 0: every seed gave the same difference" if self.seeds > 1
                      else "one seed, the difference did not vary from step to step")
        elif self.seeds > 1:
            source = f"s.e. over {self.seeds} seeds; 95 % needs |effect| > {self.threshold:.2f} s.e. = {self.mde:.2g}"
        else:
            source = (f"one seed, step-to-step std; needs > {self.threshold:.0f} std = {self.mde:.2g}" if math.isfinite(self.noise)
                      else "one seed: no noise estimate")
        verdict = "larger than" if self.larger_than_noise else "not larger than"
        verdict += " seed noise" if self.seeds > 1 else " the noise"
        if self.no_spread:  # e.g. a held-out accuracy that moved by the same net count of prompts in every seed
            verdict = "not testable: no spread to test it against, so not called larger"
        elif not self.larger_than_noise:
            verdict += (f" — no effect larger than {self.mde:.2g}{unit} could be seen" if math.isfinite(self.mde)
                        else " — without a noise estimate no effect can be called larger")
        a, b = self.names
        noise = shown(self.noise, ".2g", why_undefined("noise", vars(self)))
        return (f"{self.key}: {a} {shown(self.bug)}, {b} {shown(self.fix)}{unit}; effect {shown(self.difference, '+.3g')} ± "
                f"{noise} ({source}): {verdict}")


def _paired(key: str, a, b, names: tuple[str, str], threshold: float, noise: float | None = None) -> Effect:
    """a − b per seed (paired: same seed, same prompts), its mean against ``noise`` — by default the
    standard error over seeds (one seed: none) — and counted as real beyond ``threshold`` × noise. A noise of
    exactly 0 (every seed gave the same difference: a discrete metric such as greedy accuracy that moved by the
    same net count of prompts in each run) leaves nothing to test against: never called larger, MDE NaN."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    differences = a - b
    if noise is None:
        if n > 1 and bool(np.all(differences == differences[0])):
            noise = 0.0  # set, not computed: np.std of equal values can round to ~1e-16 (three 0.7s), not 0
        else:
            noise = float(np.std(differences, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    difference = float(np.mean(differences))
    return Effect(key=key, bug=float(np.mean(a)), fix=float(np.mean(b)), difference=difference, noise=noise, seeds=n,
                  larger_than_noise=bool(np.isfinite(noise) and noise > 0 and abs(difference) > threshold * noise),
                  threshold=threshold, names=names,
                  mde=float(threshold * noise) if noise != 0 else float("nan"))


def effect(runs: dict[str, list[list[dict]]], key: str, bug: str, fix: str, *, fraction: float = 0.25,
           factor: float | None = None, at: str = "end") -> Effect:
    """Compare ``runs[bug]`` with ``runs[fix]`` on the tail mean of ``key`` (``at="start"``: on the
    first step's value, e.g. a gap that exists before any update and is therefore not learnt).

    The effect counts as real when |difference| > threshold × noise: with ≥ 2 seeds the noise is the
    standard error of the paired per-seed differences and the threshold the 95 % Student-t value for
    n − 1 degrees of freedom (4.30 for 3 seeds; ``factor`` overrides it); with one seed the noise is the
    spread (standard deviation, not its standard error: steps are correlated and seeds are not
    sampled) of the per-step differences over the tail, the threshold 2 (or ``factor``), and the
    sentence names it.
    """
    if at not in ("end", "start"):
        raise ValueError(f"at={at!r}: choose 'end' (tail mean) or 'start' (first step)")
    bug_runs, fix_runs = runs[bug], runs[fix]
    n = min(len(bug_runs), len(fix_runs))

    def value(history):
        return float(history[0][key]) if at == "start" else tail_mean(history, key, fraction)

    noise = None  # several seeds: the standard error of the paired differences
    if n == 1 and at == "start":
        noise = float("nan")  # one value per run: no noise estimate
    elif n == 1:
        def tail(history):
            values = np.array([h[key] for h in history if key in h], dtype=float)
            return values[-max(2, math.ceil(len(values) * fraction)):]
        bug_tail, fix_tail = tail(bug_runs[0]), tail(fix_runs[0])
        steps = min(len(bug_tail), len(fix_tail))
        noise = float(np.nanstd(bug_tail[-steps:] - fix_tail[-steps:], ddof=1)) if steps > 1 else float("nan")
    threshold = _threshold(n, factor) if n > 1 else (factor if factor is not None else 2.0)
    return _paired(key + (" at step 0" if at == "start" else ""), [value(h) for h in bug_runs[:n]],
                   [value(h) for h in fix_runs[:n]], (bug, fix), threshold, noise)


def gain(runs: dict[str, list[list[dict]]], label: str, key: str = "heldout_accuracy", *, factor: float | None = None) -> Effect:
    """Did ``label``'s runs learn? Held-out greedy accuracy after − before (``train_variants(...,
    held_out=N)``; another held-out ``key`` recorded with ``{key}_start``, e.g. DPO's
    ``heldout_logp_chosen``), against the standard error over seeds (one seed: no noise estimate,
    never "larger"). The ``Effect`` reads end (``bug``) vs start (``fix``)."""
    records = [history[-1] for history in runs[label]]
    if not records or any(key not in r or f"{key}_start" not in r for r in records):
        raise ValueError(f"gain({label!r}, {key!r}): the runs carry no held-out {key}; "
                         "train with train_variants(..., held_out=N)")
    name = "held-out greedy accuracy" if key == "heldout_accuracy" else key
    return _paired(f"{name}, {label}", [r[key] for r in records], [r[f"{key}_start"] for r in records], ("end", "start"),
                   _threshold(len(records), factor))


def heldout_gains(runs: dict[str, list[list[dict]]], labels=None) -> dict[str, dict]:
    """``{label: vars(gain(runs, label))}`` for each of ``labels`` (default: every variant of ``runs``): the
    ``heldout_gain`` entry of a notebook's metrics."""
    return {label: vars(gain(runs, label)) for label in (runs if labels is None else labels)}


def bug_fix_by_setting(results: dict, settings, key: str) -> dict[str, dict[str, float]]:
    """``{"<key>_bug": {setting: value, …}, "<key>_fix": {…}}`` read from sweep records ``results[setting, fixed]``
    (``fixed`` False: the bug): a sweep's bug and fix entries of a notebook's metrics, settings as strings."""
    return {f"{key}_{side}": {str(s): results[s, fixed][key] for s in settings} for side, fixed in (("bug", False), ("fix", True))}


def learnt_gap(runs: dict[str, list[list[dict]]], key: str, bug: str, fix: str, *, fraction: float = 0.25,
               factor: float | None = None) -> Effect:
    """The part of the bug − fix gap in ``key`` that training added: per seed, the gap over the final
    steps minus the gap at step 0 (e.g. P7: sampling with dropout on lowers the reward before any
    update), against the standard error over seeds. Reads final gap vs step-0 gap."""
    pairs = list(zip(runs[bug], runs[fix], strict=False))
    start = [float(b[0][key]) - float(f[0][key]) for b, f in pairs]
    end = [tail_mean(b, key, fraction) - tail_mean(f, key, fraction) for b, f in pairs]
    return _paired(f"{key} gap learnt (final gap − step-0 gap)", end, start, ("final gap", "step-0 gap"),
                   _threshold(len(pairs), factor))


def drift(runs: dict[str, list[list[dict]]], label: str, key: str, *, fraction: float = 0.25, factor: float | None = None) -> Effect:
    """How far ``key`` moved during ``label``'s runs: tail mean − first step per seed, against the
    standard error over seeds (one seed: no noise estimate, never "larger"). Reads end vs start."""
    histories = runs[label]
    return _paired(f"{key}, {label}", [tail_mean(h, key, fraction) for h in histories], [float(h[0][key]) for h in histories],
                   ("end", "start"), _threshold(len(histories), factor))


def learning_sentence(runs: dict[str, list[list[dict]]]) -> str:
    """One line per variant: does its held-out greedy accuracy rise by more than the seed noise?"""
    return "\n".join(gain(runs, label).sentence() for label in runs)


DIRECTIONS = ("+", "-")


def prediction(effect: Effect, consequence: str, direction: str, task: str) -> dict:
    """The ``metrics["prediction"]`` record of a training notebook: the consequence its mechanism
    predicts, stated before the run, with the measured ``effect`` (bug − fix) and its power.

    ``direction`` is the predicted sign of bug − fix ("+": the bug raises the measure, "-": it lowers it);
    ``agrees`` is true when the effect is larger than the noise *and* has that sign. ``measure`` names the
    ``Effect``'s key. JSON-safe (``core.jsonsafe``: NaN becomes the string "nan").
    """
    if direction not in DIRECTIONS:
        raise ParameterError(f"prediction(direction={direction!r}): the predicted sign of bug − fix must be "
                             "'+' (the bug raises the measure) or '-' (the bug lowers it)")
    sign = 1.0 if direction == "+" else -1.0
    agrees = bool(effect.larger_than_noise and sign * effect.difference > 0)
    return jsonable({"consequence": str(consequence), "direction": direction, "effect": float(effect.difference),
                     "se": float(effect.noise), "threshold": float(effect.threshold), "mde": float(effect.mde),
                     "larger": bool(effect.larger_than_noise), "seeds": int(effect.seeds), "task": str(task),
                     "measure": effect.key, "agrees": agrees})


PREDICTION_VERDICTS = ("as predicted", "opposite", "null")


def recorded_number(value) -> float:
    """A recorded number as a float (``core.jsonsafe`` writes NaN as the string "nan")."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def prediction_verdict(record: dict) -> tuple[str, str]:
    """``(kind, text)`` of a ``prediction`` record, chosen by its numbers only: "as predicted" (larger than the
    noise with the predicted sign), "opposite" (larger, the other sign) or "null" ("no effect > MDE", no noise
    estimate with one seed, or no spread at all: s.e. 0, "not testable")."""
    effect, mde = recorded_number(record.get("effect")), recorded_number(record.get("mde"))
    if record.get("larger") is True:
        if ("+" if effect > 0 else "-") == record.get("direction"):
            return "as predicted", "larger, as predicted"
        return "opposite", "larger, opposite to the prediction"
    if recorded_number(record.get("se")) == 0:
        return "null", ("not testable: no spread over seeds (s.e. 0)" if record.get("seeds", 2) != 1
                        else "not testable: one seed whose difference never varied")
    return "null", (f"no effect > {mde:.3g}" if math.isfinite(mde) else "no effect seen (no noise estimate)")


def prediction_sentence(record: dict, unit: str = "") -> str:
    """The line a training notebook prints under its run: the consequence stated before it, what was measured
    and the verdict with its power, e.g. "predicted on sums: length of incorrect responses, bug − fix > 0;
    measured +2.1 ± 0.4 tokens (3 seeds, needs > 4.30 s.e. = 1.7): larger, as predicted"."""
    unit = f" {unit}" if unit else ""
    effect, se = recorded_number(record.get("effect")), recorded_number(record.get("se"))
    threshold, mde = recorded_number(record.get("threshold")), recorded_number(record.get("mde"))
    sign = ">" if record.get("direction") == "+" else "<"
    _, text = prediction_verdict(record)
    if se == 0:
        power = "s.e. 0: no spread"
    elif not math.isfinite(se):
        power = why_undefined("se", record)
    else:
        power = f"needs > {shown(threshold, '.2f', why_undefined('threshold', record))} s.e. = {shown(mde, '.2g')}{unit}"
    spread = shown(se, ".2g", why_undefined("se", record)) + (unit if math.isfinite(se) else "")
    return (f"predicted on {record.get('task')}: {record.get('consequence')}, bug − fix {sign} 0; measured "
            f"{shown(effect, '+.3g')} ± {spread} ({record.get('seeds')} seed(s), {power}): {text}")


@dataclass(frozen=True)
class Prediction:
    """The training consequence a pitfall's mechanism predicts, fixed in its module before any run: which measure
    (a key of the notebook's effects), what it means, and the sign of bug − fix. ``record`` gives the
    ``metrics["prediction"]`` entry, ``sentence`` the printed line, both from the measured ``Effect``."""

    measure: str
    consequence: str
    direction: str
    unit: str = ""

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ParameterError(f"Prediction(direction={self.direction!r}): use '+' (the bug raises {self.measure}) or '-'")

    def record(self, effects: dict, task: str) -> dict:
        """``prediction(effects[measure], …)``: the metrics entry (KeyError naming the measure when it was not measured)."""
        if self.measure not in effects:
            raise KeyError(f"the prediction's measure {self.measure!r} is not among the effects {sorted(map(str, effects))}")
        return prediction(effects[self.measure], self.consequence, self.direction, task)

    def sentence(self, effects: dict, task: str) -> str:
        return prediction_sentence(self.record(effects, task), self.unit)


# ---- what a training cell prints ----------------------------------------------------------------------------------
def plain_verdict(effect: Effect, unit: str = "") -> str:
    """The verdict of one ``Effect`` in a plain sentence, its threshold and its power said in words: "larger than seed
    noise: the effect, +2.2 tokens, is 5.5 standard errors from 0 over 3 seeds (95 % confidence needs more than 4.30)"."""
    unit = f" {unit}" if unit else ""
    if effect.no_spread:
        same = "every seed gave the same difference" if effect.seeds > 1 else "the difference was the same at every step"
        return f"not testable: {same} ({effect.difference:+.3g}{unit}), so there is no noise to test it against"
    if not math.isfinite(effect.noise):
        return f"not tested: one seed gives no noise estimate (effect {effect.difference:+.3g}{unit})"
    distance = abs(effect.difference) / effect.noise
    if effect.seeds > 1:
        head = "larger than seed noise" if effect.larger_than_noise else "not larger than seed noise"
        noise = f"standard errors from 0 over {effect.seeds} seeds (95 % confidence needs more than {effect.threshold:.2f})"
        power = "these seeds could see"
    else:
        head = "larger than the noise" if effect.larger_than_noise else "not larger than the noise"
        noise = (f"step-to-step standard deviations from 0 (one seed: the noise is how much the difference varied over "
                 f"the final steps; it needs more than {effect.threshold:.0f})")
        power = "this run could see"
    text = f"{head}: the effect, {effect.difference:+.3g}{unit}, is {distance:.1f} {noise}"
    if not effect.larger_than_noise:
        text += f"; {power} an effect of {effect.mde:.2g}{unit} or more"
    return text


def _cell(value: float, digits: str = ".3g") -> str:
    return format(value, digits) if math.isfinite(value) else "—"


def effects_table(effects: dict[str, Effect], gains: dict[str, Effect] | None = None) -> str:
    """Small tables of a training comparison: one row per measured ``Effect`` (both sides, bug − fix, its standard
    error — with one seed, the step-to-step standard deviation — the smallest effect the seeds could see, the verdict);
    then, under their own header, each variant's held-out accuracy at the start and the end and its gain. Undefined
    numbers print as "—" with the reason in the verdict column."""

    def verdict(effect: Effect) -> str:
        if effect.no_spread:
            return "not testable (s.e. 0)"
        if not math.isfinite(effect.noise):
            return "not tested (one seed)"
        return "larger" if effect.larger_than_noise else "not larger"

    def aligned(rows) -> list[str]:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        last = len(rows[0]) - 1
        return ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width) if i < last else cell
                          for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip() for row in rows]

    every = [*effects.values(), *(gains or {}).values()]
    noise = "± std" if every and all(effect.seeds == 1 for effect in every) else "± s.e."
    rows = [("measure", "bug", "fix", "bug − fix", noise, "could see ≥", "verdict")]
    for name, effect in effects.items():
        rows.append((str(name), _cell(effect.bug), _cell(effect.fix), _cell(effect.difference, "+.3g"),
                     _cell(effect.noise, ".2g"), _cell(effect.mde, ".2g"), verdict(effect)))
    lines = aligned(rows)
    if gains:
        held_out = [("held-out accuracy", "start", "end", "gain", noise, "could see ≥", "verdict")]
        for label, effect in gains.items():
            held_out.append((str(label), _cell(effect.fix), _cell(effect.bug), _cell(effect.difference, "+.3g"),
                             _cell(effect.noise, ".2g"), _cell(effect.mde, ".2g"), verdict(effect)))
        lines += ["", *aligned(held_out)]
    return "\n".join(lines)


def training_summary(effects: dict[str, Effect], runs: dict[str, list[list[dict]]], prediction: Prediction, task: str) -> str:
    """What a training cell prints: the prediction fixed before the run and its outcome in one plain sentence, then
    ``effects_table`` (the effects and each variant's held-out gain); the full records go to ``metrics.json``."""
    effect = effects[prediction.measure]
    sign = "above" if prediction.direction == "+" else "below"
    lines = [f"Prediction, fixed before the run ({task}): {prediction.consequence}, the bug's value {sign} the fix's.",
             f"Outcome: {plain_verdict(effect, prediction.unit)}; "
             + {"as predicted": "as predicted.", "opposite": "opposite to the prediction.",
                "null": "the prediction is not borne out by these seeds." if effect.seeds > 1 and math.isfinite(effect.noise)
                else "one seed is not a test of the prediction (run several seeds)."}[
                 prediction_verdict(prediction.record(effects, task))[0]]]
    table = effects_table(effects, {label: gain(runs, label) for label in runs}
                          if all("heldout_accuracy" in h[-1] for histories in runs.values() for h in histories if h) else None)
    pairs = {effect.names for effect in effects.values()}
    (bug, fix), = pairs if len(pairs) == 1 else {("bug", "fix")}
    compared = f"bug − fix: {bug} − {fix}; " if (bug, fix) != ("bug", "fix") else ""
    return "\n".join(lines + ["", table, f"({compared}every record, with each seed's values: metrics.json)"])
