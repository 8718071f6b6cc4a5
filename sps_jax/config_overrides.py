"""Reading a ``--config FILE[:ARG]`` and its ``--config.a.b=VALUE`` overrides: the overrides split from a command
line (:func:`split_config_args`), parsed and applied to a config, each value held to the kind of the field it
sets (:func:`apply_override`), and the parts of :func:`sps_jax.config.load_config` that find the file, check its
``get_config`` takes the argument, and say where the file failed (:func:`failure_text`).
"""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import re
import traceback
from collections.abc import Iterable, Mapping
from typing import Sequence

import ml_collections
import numpy as np

from sps_jax import cli
from sps_jax.names import close_name
from sps_jax.cli import UserError

# The shipped configs/ folder sits beside the package in a source checkout (the README's editable install).
_SHIPPED_CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"

# The words a window takes for no bound, in any case: in a config file's argument and in a window's override.
UNBOUNDED_WORDS = ("none", "inf", "unbounded")


def check_overrides(overrides) -> list[str]:
    """``overrides`` as a list of ``--config.a.b=value`` strings, else one sentence: one string would be read one
    character at a time and a dict key by key, and None or (key, value) pairs would fail in Python's words."""
    must = "overrides must be a list of 'a.b=value' strings"
    if isinstance(overrides, str):
        raise UserError(f"{must}, not the string {overrides!r}: pass [{overrides!r}].")
    if isinstance(overrides, (Mapping, ml_collections.ConfigDict)) or not isinstance(overrides, Iterable):
        got = "None" if overrides is None else f"a {type(overrides).__name__}"
        raise UserError(f"{must}, got {got}: pass e.g. ['model.window=8'], or [] for none.")
    overrides = list(overrides)  # read twice by load_config: a generator would be empty the second time
    for item in overrides:
        if not isinstance(item, str):
            raise UserError(f"{must}, got the {type(item).__name__} {item!r} among them: write each as one string, "
                            "e.g. 'model.window=8'.")
    return overrides


def check_takes(get_config, arg: str | None, path: str) -> None:
    """One sentence where ``get_config`` cannot be called with the spec's argument (or with none): the spec is what
    to change, where Python's "missing 1 required positional argument" would read as a failure of the file."""
    try:
        signature = inspect.signature(get_config)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call says it
        return
    try:
        signature.bind(*([arg] if arg else []))
    except TypeError:
        if arg:
            raise UserError(f"get_config of {path} takes no argument, so the config's ':{arg}' cannot be passed to it: "
                            f"drop it (--config {path}), or give get_config an argument.") from None
        raise UserError(f"get_config of {path} needs an argument: give it after ':' (--config {path}:ARG).") from None


def plain_numbers(config: ml_collections.ConfigDict) -> None:
    """numpy scalars a config file put in its fields (a field it made, or ``np.float64(3e-3)``, which a float field
    takes) as the Python numbers they hold: the range checks, JSON and the overrides' types take Python's, and refused
    np.float64(0.003) as not "a finite number". (A numpy scalar of another type, np.int64 on an int field, is refused
    by ml_collections as the file sets it: :func:`failure_text` says so.)"""
    for key in list(config.keys()):
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            plain_numbers(value)
        elif isinstance(value, np.generic) and np.ndim(value) == 0 and isinstance(value.item(), (bool, int, float)):
            with config.ignore_type():
                config[key] = value.item()


def split_spec(spec: str) -> tuple[str, str | None]:
    """``path.py:ARG`` -> (path.py, ARG), ARG None without a colon. The argument starts after ".py:", so a colon
    in a folder's name (a timestamp) stays in the path; a spec naming no .py file splits at its first colon."""
    at = spec.find(".py:")
    if at >= 0:
        return spec[:at + 3], spec[at + 4:]
    path, colon, arg = spec.partition(":")
    return (spec, None) if spec.endswith(".py") or not colon else (path, arg)


def shipped_if_missing(path: str) -> str:
    """``configs/NAME.py`` that is not in the current folder names the shipped one, so the commands'
    default configs work from any folder; every other path stays as given."""
    parts = pathlib.PurePath(path).parts
    if os.path.exists(path) or len(parts) != 2 or parts[0] != "configs":
        return path
    shipped = _SHIPPED_CONFIGS / parts[1]
    return str(shipped) if shipped.is_file() else path


def raised_here(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by this package's code (a sentence of its own), not by a config file's."""
    frames = traceback.extract_tb(exc.__traceback__)
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(package)


# ml_collections' words for a value of another type set on a field: "Could not override field 'n' (reference). 3 is
# of original type <class 'numpy.int64'> and cannot be casted to type <class 'int'>".
_RETYPED = re.compile(r"Could not override field '(?P<field>[^']+)' \(reference\)\. (?P<value>.*) is of original type "
                      r"<class '(?P<given>[\w.]+)'> and cannot be casted to type <class '(?P<kind>[\w.]+)'>")


def failure_text(exc: BaseException, path: str) -> str:
    """' at line N: Error: what: fix the file there.', N the innermost traceback frame in ``path``."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
             if os.path.abspath(f.filename) == os.path.abspath(path)]
    where = f" at line {lines[-1]}" if lines else ""
    retyped = _RETYPED.search(str(exc)) if isinstance(exc, TypeError) else None
    if retyped:  # np.int64(8) or "2" set on an int field
        kind = retyped["kind"].removeprefix("builtins.")
        article = lambda word: "an" if word[0] in "aeiou" else "a"  # noqa: E731
        shown = repr(retyped["value"]) if retyped["given"] == "str" else retyped["value"]  # c.train.seed = '3'
        given = f"{shown} is {article(retyped['given'])} {retyped['given']}"
        if kind.endswith(".ConfigDict"):  # c.train = 5: a section replaced by a value
            return (f"{where}: {retyped['field']!r} is a section of fields, and {given}: set its fields instead of "
                    "replacing it.")
        if retyped["given"] == "bool" and kind in ("int", "float"):  # as --config.a.b=True is told
            return (f"{where}: field {retyped['field']!r} holds {kind} values, and {given}: set "
                    f"{'an integer' if kind == 'int' else 'a number'} there, not True or False.")
        number = f" (a plain Python number: {kind}(value))" if kind in ("int", "float") else ""
        nullable = " or None" if any(key.endswith(f".{retyped['field']}") for key in UNSET_KINDS) else ""
        return (f"{where}: field {retyped['field']!r} holds {kind} values, and {given}: set {article(kind)} {kind}"
                f"{nullable} there{number}.")
    said = f"{type(exc).__name__}: {cli.sentence(exc).rstrip('.')}" if str(exc).strip() else type(exc).__name__
    return f"{where}: {said}: fix the file{' there' if lines else ''}."


def override_value(overrides, key: str, default=None):
    """The value (:func:`literal_value`) of the last override of ``key`` among ``overrides``, else ``default``."""
    items = [item for item in overrides if override_key(item) == key]
    return literal_value(items[-1].partition("=")[2]) if items else default


def literal_value(text: str):
    """An override's value: a Python literal, else the text itself (bare strings: --config.model.variant=sps)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def override_key(item: str) -> str:
    """``a.b`` of an override ``--config.a.b=value`` (or ``a.b=value``)."""
    return item.removeprefix("--").removeprefix("config.").partition("=")[0]


def apply_override(config: ml_collections.ConfigDict, item: str) -> None:
    """Set ``a.b=value`` (a leading ``--config.`` is accepted); values parse as Python literals.

    A value must fit the field's current type: integers for integer fields (``2e10`` counts),
    numbers for float fields, ``True``/``False`` for flags, any text for string fields; ``None``
    is accepted everywhere and left to the checks of whoever reads the field.
    """
    key = override_key(item)
    _, sep, text = item.partition("=")
    if not sep:
        raise ValueError(f"override {item!r} must look like --config.a.b=value.")
    *parents, leaf = key.split(".")
    if not all([*parents, leaf]):
        raise ValueError(f"override {item!r} leaves a name empty: write --config.SECTION.FIELD=VALUE, e.g. "
                         "--config.train.seed=1.")
    node = config
    for depth, name in enumerate(parents):
        if name not in node or not isinstance(node[name], ml_collections.ConfigDict):
            raise ValueError(f"override {item!r}: {_no_key(node, parents[:depth], name, section=True)}")
        node = node[name]
    if leaf not in node:
        raise ValueError(f"override {item!r}: {_no_key(node, parents, leaf, section=False)}")
    old = node[leaf]
    if isinstance(old, ml_collections.ConfigDict):
        raise ValueError(f"override {item!r}: {key} is a section, not a field: set its fields, "
                         f"e.g. --config.{key}.{next(iter(old.keys()), 'FIELD')}=VALUE.")
    if key in UNSET_KINDS and text.strip().lower() in _none_words(key):  # no number: 'none' says None
        value = None
    elif key in UNSET_KINDS:  # the field's kind says what the text is, a None in it saying nothing of its kind
        value = fit_value(UNSET_KINDS[key], literal_value(text), text, item, unset=old)
    else:
        value = fit_value(old, literal_value(text), text, item)
    with node.ignore_type():
        node[leaf] = value


def _no_key(node, path: list[str], name: str, section: bool) -> str:
    """What to say of ``name``, which the config section at ``path`` lacks as a section (``section``) or
    as a field: the key it is likely a typo of, and the keys there are."""
    where = "config." + ".".join(path) if path else "the config"
    keys = sorted(k for k in node.keys() if not section or isinstance(node[k], ml_collections.ConfigDict))
    kind = "section" if section else "field"
    if section and name in node:  # a field where a section was expected: --config.name.x=1
        dotted = ".".join([*path, name])
        return f"config.{dotted} is a field, not a section: set it as --config.{dotted}=VALUE."
    close = close_name(name, keys)
    guess = f" (did you mean --config.{'.'.join([*path, close])}?)" if close else ""
    if not keys:  # an empty list would say nothing
        return f"{where} has no {kind}s, so no {kind} {name!r}: its get_config builds none (see configs/tiny.py)."
    return f"{where} has no {kind} {name!r}{guess}: its {kind}s are {', '.join(keys)}."


# A value of the kind of each number field that None may fill (a field's None says nothing of its kind): what an
# override of it takes, as a set field's value says, and None, which ``none`` in any case says too (no number is
# that word). Text fields that None may fill take any literal, their checks saying what they take: ``none`` is text
# there (a folder or a W&B entity may have that name), and the literal None unsets them.
UNSET_KINDS = {"model.window": 0, "model.persistent_window": 0, "train.grad_clip": 0.0,
               "train.peak_flops_per_device": 0.0}
_WINDOWS = ("model.window", "model.persistent_window")


def _none_words(key: str) -> tuple[str, ...]:
    """The words an override of ``key``, a field of :data:`UNSET_KINDS`, takes for None: a window's for no bound."""
    return UNBOUNDED_WORDS if key in _WINDOWS else ("none",)


_NOT_GIVEN = object()


def fit_value(old, value, text: str, item: str, unset=_NOT_GIVEN):
    """``value`` converted to the kind of ``old`` (see :func:`apply_override`), else one sentence; ``unset`` (given
    for a field None may fill): the field's value, and ``old`` a value of its kind."""
    if isinstance(value, dict):  # a literal {...} would become a section of fields where a value goes
        raise ValueError(f"override {item!r}: the field takes a value, not the section of fields {text!r}.")
    if value is None or old is None:
        return value
    if isinstance(old, str):
        return value if isinstance(value, str) else text  # --config.data.dir=2024 names a folder "2024"
    if isinstance(old, bool):
        kind, ok = "True or False", isinstance(value, bool)
    elif isinstance(old, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        kind, ok = "an integer", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(old, float):
        kind, ok = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        return value
    if not ok:
        nullable = unset is not _NOT_GIVEN
        raise ValueError(f"override {item!r}: the field takes {kind}{' or None' if nullable else ''} (its value is "
                         f"{unset if nullable else old!r}), not {text!r}.")
    return value


def split_config_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``--config.a.b=value`` overrides from the other command-line arguments. An override
    whose value follows a space, before or after its ``=``, or a ``:``, is one sentence saying to join them with ``=``
    (argparse would only call the value an unrecognized argument). A key given twice takes its last value (they apply in
    order), so a script can add an override to a shared list."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        key, equals, value = arg.partition("=")
        if not key.startswith("--config.") or value:
            continue
        key, colon, written = key.partition(":")  # YAML's --config.a.b:V
        after = [written] if colon and written else argv[i + 1:]
        if not equals and after[:1] == ["="]:  # spaces around '=': the value is the word after it
            after = after[1:]
        following = after[0] if after and not after[0].startswith("--") else None
        if equals and following is None:
            continue  # an empty value, which the field's checks judge
        following = following if equals or following is None else following.removeprefix("=")  # a space before '='
        raise UserError(f"override {key} has no value: write {key}={following or 'VALUE'}, the value after '=' "
                        "with no space.")
    overrides = [a for a in argv if a.startswith("--config.")]
    rest = [a for a in argv if not a.startswith("--config.")]
    return rest, overrides
