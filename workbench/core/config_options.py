"""Command-line options built from a config dataclass, with its field docstrings as ``--help``.

A trainer config documents each field with a string right under it and groups fields with marker
comments (``# ---- Rollout ----``), as TRL's configs group theirs in sections. ``field_docs`` reads
both from the source (the CleanRL/tyro idea, without the dependency); ``add_config_arguments``
turns every field into a typed ``--name VALUE`` option in an argparse group per section, so

    python -m workbench train grpo --help

prints what ``num_generations`` means, its default, and where the pitfall switches are. Values are
converted to the type of the field's default by ``convert_value``, which the notebook runner uses for
``-p NAME VALUE`` too; a value of the wrong type is an error naming the field (exit code 2).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap

from workbench.core.errors import ParameterError

SECTION_MARKER = re.compile(r"^\s*#\s*-{2,}\s*(.+?)\s*-*\s*$")
DEFAULT_SECTION = "General"


def convert_value(name: str, text: str, default):
    """Convert a command-line string to the type of ``default`` (bool, int, float, str, or a Python
    literal for lists, dicts and tuples). Raises ``ParameterError`` naming ``name`` otherwise."""
    kind = type(default)
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind is str:
            return text
        if default is None:
            return ast.literal_eval(text) if text[:1] in "[{(0123456789-\"'" or text in ("None", "True", "False") else text
        value = ast.literal_eval(text)
        if not isinstance(value, kind):
            raise ValueError
        return value
    except (ValueError, SyntaxError):
        raise ParameterError(f"parameter {name!r} expects {type_phrase(kind)} (default {default!r}); got {text!r}") from None


def count_argument(text: str) -> int:
    """``argparse`` type of a count (an int ≥ 1: ``-j``, ``--limit``): argparse reports the refusal with the option's
    name and exits 2 (a plain ``int`` would let ``-j 0`` run as ``-j 1`` without a word)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects an int ≥ 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1; got {value}")
    return value


_TYPE_PHRASES = {int: "an int", float: "a float", bool: "true or false", str: "a str", list: "a list", dict: "a dict",
                 tuple: "a tuple"}


def type_phrase(kind: type) -> str:
    """How an error names the type a value must have: "an int", "a float", … (any other type: "a <name>")."""
    return _TYPE_PHRASES.get(kind) or f"a {kind.__name__}"


def field_docs(config_cls) -> dict[str, tuple[str, str]]:
    """``{field: (section, docstring)}`` for a dataclass and its dataclass bases; the most derived
    class that declares a field decides its section and text."""
    docs: dict[str, tuple[str, str]] = {}
    for cls in reversed(config_cls.__mro__):
        if not dataclasses.is_dataclass(cls) or cls is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        body = ast.parse(source).body[0].body
        section, previous_end = DEFAULT_SECTION, 0
        for i, node in enumerate(body):
            for line in lines[previous_end : node.lineno - 1]:
                marker = SECTION_MARKER.match(line)
                if marker:
                    section = marker.group(1)
            previous_end = node.end_lineno
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            following = body[i + 1] if i + 1 < len(body) else None
            doc = ""
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str):
                doc = inspect.cleandoc(following.value.value)
            docs[node.target.id] = (section, doc)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    return {name: value for name, value in docs.items() if name in fields}  # not the ClassVars


def convert_field(field: dataclasses.Field, text: str):
    """A command-line string for a config field: its default's type, or for an ``float | str``
    field with a word default (``learning_rate="auto"``) the word or a number."""
    if isinstance(field.default, str) and "float" in str(field.type):
        if text == field.default:
            return text
        return convert_value(field.name, text, 0.0)
    if isinstance(field.default, str):
        return text
    return convert_value(field.name, text, field.default)


def _converter(field: dataclasses.Field):
    def convert(text: str):
        try:
            return convert_field(field, text)
        except ParameterError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def add_config_arguments(parser: argparse.ArgumentParser, config_cls, skip: tuple[str, ...] = ()) -> None:
    """One ``--field VALUE`` option per field of ``config_cls`` (also spelt with dashes, ``--sampler-precision``; dest
    ``config__<field>``), grouped
    by section, help text = the field's docstring and default. Unset options stay unset."""
    docs = field_docs(config_cls)
    groups: dict[str, argparse._ArgumentGroup] = {}
    fields = [f for f in dataclasses.fields(config_cls) if f.name not in skip]
    order = list(dict.fromkeys(docs.get(f.name, (DEFAULT_SECTION, ""))[0] for f in fields))
    for section in order:
        title = f"{config_cls.__name__}: {section.lower()}" if section != DEFAULT_SECTION else f"{config_cls.__name__}"
        groups[section] = parser.add_argument_group(title)
    for config_field in fields:
        section, doc = docs.get(config_field.name, (DEFAULT_SECTION, ""))
        default = config_field.default
        kind = type(default).__name__ if default is not None else "value"
        dashed = config_field.name.replace("_", "-")
        names = [f"--{config_field.name}"] + ([f"--{dashed}"] if dashed != config_field.name else [])
        groups[section].add_argument(
            *names, dest=f"config__{config_field.name}", default=argparse.SUPPRESS, metavar=kind.upper(),
            type=_converter(config_field),
            help=" ".join(doc.split()).replace("%", "%%") + f" (default: {default!r})",
        )


def config_values(args: argparse.Namespace) -> dict:
    """The config fields set on the command line by ``add_config_arguments``' options."""
    return {key[len("config__"):]: value for key, value in vars(args).items() if key.startswith("config__")}
