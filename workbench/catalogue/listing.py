"""Reading the notebook catalogue: each notebook's purpose and ``parameters`` cell.

A catalogue notebook follows three conventions, enforced by ``tests/integration/test_notebooks.py``:

1. its first cell is markdown naming the pitfall;
2. its second cell is tagged ``parameters`` and holds only ``name = <literal>`` assignments
   (at least ``model``, ``seed``, ``smoke``, ``out_dir``; a notebook that runs no model or draws nothing
   at random leaves ``model`` or ``seed`` out and says why in its metadata, ``no_model``/``no_seed``);
3. its metadata ``workbench`` entry gives ``purpose`` (one line), ``smoke_parameters`` (the
   small/fast values ``--smoke`` passes) and optionally ``main_figure``.

The runner validates command-line parameters against the parameters cell, so a misspelt name
is an error listing the valid ones instead of papermill's silent warning, and checks every value a
run will use against ``PARAMETER_RULES``: one rule per parameter *name*, since a name means the same
thing in every notebook (``seeds`` a non-empty list of ints, ``model`` a checkpoint the loader can
find, …). A bad value is a ``ParameterError`` naming the notebook, the parameter, the value and what
it accepts, raised before any kernel starts; so is a ``model``/``reference_model`` pair whose
tokenizers differ (``SHARED_TOKENIZER``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.core.config_options import convert_value, type_phrase
from workbench.core.errors import ModelLoadError, ParameterError
from workbench.core.paths import REPO_ROOT

# Reading the catalogue imports neither torch nor nbformat (whose jsonschema builds a grammar at import: ~3 s): the
# rules that need the loss modes, precisions, tasks or the model loader import them when a value is checked, so
# ``python -m workbench list`` answers in well under a second (tests/catalogue/test_listing.py).

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
REQUIRED_PARAMETERS = ("model", "seed", "smoke", "out_dir")
# a required parameter a notebook may leave out, and the metadata key that must then say why
DECLARED_ABSENCES = {"model": "no_model", "seed": "no_seed"}


@dataclass
class NotebookInfo:
    stem: str
    path: Path
    purpose: str
    parameters: dict
    smoke_parameters: dict = field(default_factory=dict)
    main_figure: str | None = None
    absences: dict = field(default_factory=dict)  # {"model"/"seed": why the notebook has none}

    def missing_required(self) -> list[str]:
        """Required parameters that are neither in the parameters cell nor declared absent with a reason."""
        return [name for name in REQUIRED_PARAMETERS if name not in self.parameters and not self.absences.get(name)]


def parameters_cell_source(notebook: dict) -> str:
    """The source of the cell tagged ``parameters`` of a notebook as its JSON reads (or an ``nbformat`` node)."""
    for cell in notebook["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = cell.get("source", "")
            return source if isinstance(source, str) else "".join(source)  # the file's JSON keeps it as lines
    raise ParameterError("the notebook has no cell tagged 'parameters'")


def parse_parameters(source: str) -> dict:
    """``{name: value}`` from a parameters cell; anything but ``name = <literal>`` is an error."""
    parameters = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring-like comment string
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0], node.value
        else:
            raise ParameterError(f"line {node.lineno}: the parameters cell may only hold `name = <literal>` assignments")
        try:
            parameters[target.id] = ast.literal_eval(value)
        except ValueError:
            raise ParameterError(f"line {node.lineno}: {target.id} must be a literal (derived values go after the cell)") from None
    return parameters


def read_notebook_info(path: str | Path) -> NotebookInfo:
    path = Path(path)
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParameterError(f"{path}: cannot be read as a notebook ({exc}); pass a Jupyter notebook (.ipynb, JSON)") from None
    if not isinstance(notebook, dict) or notebook.get("nbformat") != 4 or not isinstance(notebook.get("cells"), list):
        raise ParameterError(f"{path}: not a Jupyter notebook in format 4 (no 'nbformat': 4 with a list of 'cells'); "
                             "save it with Jupyter 4 or later")
    meta = (notebook.get("metadata") or {}).get("workbench") or {}
    return NotebookInfo(
        stem=path.stem,
        path=path,
        purpose=meta.get("purpose", ""),
        parameters=parse_parameters(parameters_cell_source(notebook)),
        smoke_parameters=dict(meta.get("smoke_parameters", {})),
        main_figure=meta.get("main_figure"),
        absences={name: meta[key] for name, key in DECLARED_ABSENCES.items() if meta.get(key)},
    )


def catalogue(notebooks_dir: str | Path = NOTEBOOKS_DIR) -> list[NotebookInfo]:
    """Every notebook of the catalogue, in file-name order."""
    return [read_notebook_info(p) for p in sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))]


def find_notebook(name: str, notebooks_dir: str | Path = NOTEBOOKS_DIR) -> NotebookInfo:
    """A notebook by stem (``01_position_ids``), unique prefix (``01``) or path."""
    path = Path(name)
    if path.suffix == ".ipynb" and path.is_file():
        return read_notebook_info(path)
    infos = catalogue(notebooks_dir)
    exact = [i for i in infos if i.stem == name]
    matches = exact or [i for i in infos if i.stem.startswith(name)]
    if len(matches) != 1:
        stems = ", ".join(i.stem for i in infos)
        problem = "matches several notebooks" if matches else "is not a notebook of the catalogue"
        raise ParameterError(f"{name!r} {problem}; choose one of: {stems}")
    return matches[0]


# --------------------------------------------------------------------------------------------
# What each parameter accepts, declared once per name
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """``check(value)`` returns ``None`` for a good value, else what is wrong with it; ``accepts`` says,
    for a person, which values are good."""

    accepts: str
    check: Callable[[object], str | None]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def integer(minimum: int) -> Rule:
    return Rule(f"an int ≥ {minimum}", lambda v: None if _is_int(v) and v >= minimum else "is out of range")


def number(test: Callable[[float], bool], accepts: str) -> Rule:
    return Rule(accepts, lambda v: None if _is_number(v) and test(v) else "is out of range")


def one_of(names: Callable[[], tuple[str, ...]], what: str) -> Rule:
    """A name from the library constant ``names()`` returns (read when checked: no copy to drift)."""

    def check(v):
        return None if v in names() else f"is not a known {what}; valid: {', '.join(names())}"

    return Rule(f"a {what}", check)


def non_empty_list(item: Rule) -> Rule:
    def check(v):
        if not isinstance(v, list) or not v:
            return "is not a non-empty list"
        bad = [x for x in v if item.check(x) is not None]
        return f"holds {bad[0]!r}, which {item.check(bad[0])}" if bad else None

    return Rule(f"a non-empty list, each item {item.accepts}", check)


def _model_problem(v) -> str | None:
    if not isinstance(v, str) or not v:
        return "is not a checkpoint name"

    from workbench.modeling.models import check_model_name  # torch behind it: only when a model name is checked

    try:
        check_model_name(v)
    except ModelLoadError as exc:
        return f"is not a checkpoint the loader can find: {exc}"
    return None


def _loss_agg_modes() -> tuple[str, ...]:
    from workbench.core.losses import LOSS_AGG_ALIASES, LOSS_AGG_MODES

    return LOSS_AGG_MODES + tuple(LOSS_AGG_ALIASES)


def _trl_loss_types() -> tuple[str, ...]:
    from workbench.core.losses import LOSS_AGG_ALIASES

    return tuple(LOSS_AGG_ALIASES)


def _precisions() -> tuple[str, ...]:
    from workbench.trainers.base import PRECISIONS

    return PRECISIONS


def _tasks() -> tuple[str, ...]:
    from workbench.tasks.registry import TASKS

    return tuple(TASKS)


MODEL = Rule("a built-in name (tiny-*), realistic-<flavour>[-chat], or a local checkpoint folder holding config.json",
             _model_problem)
COUNT = integer(1)
POSITIVE = number(lambda v: v > 0, "a number > 0")
NON_NEGATIVE = number(lambda v: v >= 0, "a number ≥ 0")
PROBABILITY = number(lambda v: 0 <= v <= 1, "a probability in [0, 1]")
TEXT = Rule("a non-empty string", lambda v: None if isinstance(v, str) and v else "is empty")


def _device_problem(v) -> str | None:
    if not (isinstance(v, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", v)):
        return "is not a device name"
    if not v.startswith("cuda"):
        return None
    from workbench.core.devices import device_problem  # torch behind it: only when CUDA is asked for

    problem = device_problem(v)
    return problem[0] if problem else None  # the fix is the rule's `accepts`


DEVICE = Rule('"auto", "cpu", "cuda" or "cuda:N" (CUDA where this machine has it)', _device_problem)

PARAMETER_RULES: dict[str, Rule] = {
    # checkpoints
    "model": MODEL,
    "rope_model": MODEL,
    "reference_model": Rule("None (the policy's own checkpoint, slightly perturbed) or " + MODEL.accepts,
                            lambda v: None if v is None else _model_problem(v)),
    "architectures": non_empty_list(MODEL),
    "pad_token": Rule('"auto" or a token string', TEXT.check),
    "device": DEVICE,
    "precision": one_of(_precisions, "precision"),
    "task": one_of(_tasks, "task (workbench/tasks/registry.py)"),
    "old_logprobs": one_of(lambda: ("rollout", "recompute"), "source of π_old"),
    # mode names
    "modes": non_empty_list(one_of(_loss_agg_modes, "loss aggregation mode")),
    "trl_loss_types": non_empty_list(one_of(_trl_loss_types, "TRL loss_type")),
    # lists the notebook sweeps over
    "seeds": non_empty_list(integer(0)),
    "batch_sizes": non_empty_list(COUNT),
    "micro_batch_counts": non_empty_list(COUNT),
    "micro_batch_sizes": non_empty_list(COUNT),
    "sample_sizes": non_empty_list(COUNT),
    "top_ks": non_empty_list(COUNT),
    "extra_pads": non_empty_list(integer(0)),
    "pad_lengths": non_empty_list(integer(0)),
    "drop_probs": non_empty_list(PROBABILITY),
    "dropouts": non_empty_list(PROBABILITY),
    "top_ps": non_empty_list(number(lambda v: 0 < v <= 1, "a number in (0, 1]")),
    "temperatures": non_empty_list(POSITIVE),
    "learning_rates": non_empty_list(POSITIVE),
    "noise_scales": non_empty_list(NON_NEGATIVE),
    "off_policy_steps": non_empty_list(NON_NEGATIVE),
    "spreads": non_empty_list(POSITIVE),
    "values": non_empty_list(POSITIVE),
    "long_lengths": non_empty_list(COUNT),
    "lams": non_empty_list(PROBABILITY),
    "texts": non_empty_list(TEXT),
    # counts
    **{name: COUNT for name in ("train_steps", "ppo_steps", "sft_steps", "adam_steps", "curve_steps", "n_prompts",
                                "n_episodes", "n_texts", "batch_size", "trials", "eval_prompts", "examples",
                                "step0_batches", "throughput_rows", "train_micro_batch", "workers", "processes", "world_size",
                                "max_new_tokens", "short_budget", "short_length")},
    "group_size": integer(2),
    "vocab": integer(2),
    "held_out": integer(0),
    "extra_pad": integer(0),
    "long_prompts": integer(0),
    # numbers
    "beta": NON_NEGATIVE,
    "gamma": PROBABILITY,
    "lam": PROBABILITY,
    "missing_eos_penalty": NON_NEGATIVE,
    "tis_cap": POSITIVE,
    "temperature": POSITIVE,
    "headline_temperature": POSITIVE,
    "headline_lr": POSITIVE,
    # notebooks 27-31
    "lags": non_empty_list(integer(0)),
    "train_prompts": COUNT,
    "learning_rate": POSITIVE,
    "clip_epsilon": number(lambda v: 0 < v < 1, "a number in (0, 1)"),
    "logit_stds": non_empty_list(POSITIVE),
    "steps_per_generation": non_empty_list(COUNT),
    "gradient_accumulation_steps": COUNT,
    "micro_steps": COUNT,
    "prompts_per_slice": COUNT,
    "updates": non_empty_list(integer(0)),
    # notebooks 32–35
    "world_sizes": non_empty_list(COUNT),
    "imbalances": non_empty_list(number(lambda v: v >= 1, "a number ≥ 1")),
    "sequences_per_rank": COUNT,
    "max_norm_fraction": POSITIVE,
    "n_segments": integer(2),
    "pack_sizes": non_empty_list(COUNT),
    "n_turns": integer(2),
    "turn_length": COUNT,
    "tool_length": integer(0),
    "tool_lengths": non_empty_list(integer(0)),
    "max_response_length": COUNT,
    "overlong_buffer": COUNT,
    # notebooks 37–40
    "steps": integer(2),
    "intervals": non_empty_list(COUNT),
    "lora_rank": COUNT,
    "resumes": non_empty_list(COUNT),
    "kl_coef": NON_NEGATIVE,
    "sleep_level": Rule("1 (offload the weights) or 2 (discard them)", lambda v: None if v in (1, 2) and _is_int(v) else "is not 1 or 2"),
    # notebooks 41–44
    "draft_model": Rule('"auto" (tiny-arith-gpt2 where it shares the tokenizer, else the policy perturbed) or ' + MODEL.accepts,
                        lambda v: None if v == "auto" else _model_problem(v)),
    "acceptance": one_of(lambda: ("typical", "resample_target"), "non-preserving acceptance rule"),
    "update_interval": COUNT,
    "update_intervals": non_empty_list(COUNT),
    "slots": COUNT,
    # notebooks 45–48
    "unparseable_shares": non_empty_list(PROBABILITY),
    "headline_share": PROBABILITY,
    "accuracy": number(lambda v: 0 < v < 1, "a number in (0, 1)"),
    **{name: COUNT for name in ("n_sequences", "length", "n_contexts", "epochs")},
    "clip_low": number(lambda v: 0 < v < 1, "a number in (0, 1)"),
    "clip_high": POSITIVE,
    "engine_temperature": POSITIVE,
    "granularities": non_empty_list(one_of(lambda: ("tensor", "channel"), "FP8 scale granularity")),
    "headline_granularity": one_of(lambda: ("tensor", "channel"), "FP8 scale granularity"),
}
# Parameters whose default's type is all there is to check (any bool, any string, any seed).
TYPE_ONLY_PARAMETERS = ("seed", "smoke", "out_dir", "interactive", "first_message", "second_message", "create_envs",
                        "reuse_results", "run_trl", "deep", "packed", "run_engine")
# Parameter pairs whose checkpoints must share a tokenizer (one scores the other's token ids).
SHARED_TOKENIZER = (("model", "reference_model"),)


def check_parameters(info: NotebookInfo, values: dict) -> None:
    """``ParameterError`` for the first value of ``values`` that its rule refuses, or a ``SHARED_TOKENIZER``
    pair whose tokenizers differ, naming notebook, parameter, value and what is accepted."""
    for name, value in values.items():
        rule = PARAMETER_RULES.get(name)
        problem = rule.check(value) if rule else None
        if problem:
            raise ParameterError(f"{info.stem}: parameter {name!r} = {value!r} {problem}; {name} accepts {rule.accepts}")
    for first, second in SHARED_TOKENIZER:
        a, b = values.get(first), values.get(second)
        if a is not None and b is not None and a != b:
            from workbench.modeling.models import check_same_tokenizer  # torch behind it: only for such a pair

            try:
                check_same_tokenizer(a, b)
            except ModelLoadError as exc:
                raise ParameterError(f"{info.stem}: {first} and {second} must share a tokenizer: {exc} "
                                     f"(or leave {second} unset: the policy's own checkpoint)") from None


def resolve_parameters(info: NotebookInfo, overrides: dict, smoke: bool = False) -> dict:
    """The parameters to inject: smoke values (if ``smoke``), then the user's overrides.

    ``overrides`` values may be strings (from the command line, converted to the default's
    type) or Python values (checked against the default's type). Every value the run will use
    (defaults included) is then checked against ``PARAMETER_RULES`` (``check_parameters``).
    """
    unknown = sorted(set(overrides) - set(info.parameters))
    if unknown:
        raise ParameterError(
            f"{info.stem} has no parameter {', '.join(map(repr, unknown))}; valid names: {', '.join(info.parameters)}"
        )
    resolved = {}
    if "interactive" in info.parameters:
        resolved["interactive"] = False  # batch runs never wait for a widget
    if smoke:
        resolved.update(info.smoke_parameters)
        resolved["smoke"] = True
    for name, value in overrides.items():
        default = info.parameters[name]
        if isinstance(value, str) and not isinstance(default, str):
            value = convert_value(name, value, default)
        elif default is not None and not isinstance(value, type(default)) and not (
            isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)
        ):
            raise ParameterError(f"parameter {name!r} expects {type_phrase(type(default))}; got {value!r}")
        resolved[name] = value
    check_parameters(info, {**info.parameters, **resolved})
    return resolved
