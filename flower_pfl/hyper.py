"""One configuration value's declaration (:class:`Hyper`), its validator and the YAML reader.

Pure data (no torch, no Flower): the papers' contracts (``flower_pfl/catalog/*.py``) declare
their parameters with :func:`flower_pfl.contract.param`, from which each :class:`Hyper` is
derived; the run configuration's own fields (config.py) use :func:`check_value` too.
Defaults are the papers' values where the paper states them and our choices otherwise.
A ``doc`` says what the parameter does and why its default, in words, and points to the
docs section that holds the measurements (docs/RESULTS.md, docs/algorithms/*.md): run
numbers and issue numbers go stale in code, so they live only in docs/.  No default may
silently disable a method's mechanism.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml


class ConfigError(ValueError):
    """The run configuration is invalid; the message lists every problem (raised by
    flower_pfl.config, which exports it; defined here for the YAML loader below)."""


@dataclass(frozen=True)
class Hyper:
    """One hyper-parameter of a strategy."""

    default: Any
    types: tuple[type, ...]
    check: Callable[[Any], bool] | None = None
    allowed: str = ""
    doc: str = ""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` naming the closest of ``candidates`` (difflib, ratio >= 0.6),
    or ``""``.  The one suggestion for every misspelt name: configuration keys, strategies,
    hyper-parameters (config.py, :meth:`Entry.validate_hyper`, the command line)."""
    close = difflib.get_close_matches(name, [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


TYPE_NAMES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
              "dict": "mapping", "list": "list"}


def check_value(name: str, value: Any, types: tuple[type, ...],
                check: Callable[[Any], bool] | None = None, allowed: str = "",
                nullable: bool = False) -> tuple[Any, str | None]:
    """One configuration value against its types and range: ``(value, None)`` -- an integer
    given for a number becomes a float, a whole float (``1e4``) given for an integer an
    integer -- or ``(None, the problem in words)``.  A boolean is
    not an integer here; None passes only where ``nullable``.  The one validator of the run
    configuration (config.py's FIELDS) and of every hyper-parameter (catalog's Hyper)."""
    if value is None and nullable:
        return None, None
    if isinstance(value, float) and int in types and float not in types and value.is_integer():
        value = int(value)  # 1e4 written for an integer (YAML and --set read it as a float)
    if value is None or (isinstance(value, bool) and bool not in types) \
            or not isinstance(value, types):
        expected = " or ".join(dict.fromkeys(TYPE_NAMES.get(t.__name__, t.__name__)
                                             for t in types))
        return None, f"'{name}' = {value!r} has the wrong type: expected {expected} ({allowed})"
    if check is not None and not check(value):
        return None, f"'{name}' = {value!r} is out of range: allowed is {allowed}"
    if isinstance(value, int) and not isinstance(value, bool) and float in types:
        value = float(value)
    return value, None


# --------------------------------------------- reading values as people write them (YAML)
class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last)
    and reads numbers as people write them: YAML 1.1 (PyYAML) takes ``1e-2``, ``1E6`` and
    ``1.0e6`` for text (its float needs a dot and a signed exponent); YAML 1.2 and Python
    read them as floats, and so does this loader (:data:`EXPONENT_FLOAT`)."""


#: a float in exponent form without YAML 1.1's dot or exponent sign (1e-2, 5E4, 1.0e6, -2e+3)
EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT,
                                    list("-+0123456789."))


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode,
                                 deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(f"{loader.name}: key '{key}' is written twice (lines {seen[key]} and "
                              f"{line}); YAML would silently keep the second -- keep one")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)


def parse_scalar(raw: str) -> Any:
    """One ``--set`` value as YAML reads it in the file (:class:`StrictLoader`): ``5`` an
    int, ``0.5`` / ``1e-2`` / ``1E6`` a float, ``null`` None, anything else as written."""
    try:
        return yaml.load(raw, Loader=StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override value {raw!r} is not a YAML value: {exc}") from exc


def read_yaml(text: str) -> Any:
    """``text`` parsed as the run's YAML files are (:class:`StrictLoader`: ``1e-2`` a
    number, a duplicate key refused); bench matrices and cell files read the same way."""
    return yaml.load(text, Loader=StrictLoader)


def tab_message(path: Path, exc: yaml.YAMLError) -> str | None:
    """"indent with spaces", naming the line and column (1-based) of the tab, where the
    parser's error comes from a tab (YAML forbids tabs in indentation); else None."""
    mark = getattr(exc, "problem_mark", None)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    tab_error = "'\\t'" in str(exc)  # PyYAML: found character '\t' that cannot start ...
    at = mark.line if mark is not None and mark.line < len(lines) else None
    indented = [i for i, text in enumerate(lines)
                if "\t" in text[:len(text) - len(text.lstrip(" \t"))]]
    if at is not None and "\t" in lines[at] and (tab_error or at in indented):
        line = at
    elif indented and (tab_error or at in indented or (at is not None and indented[0] <= at)):
        line = indented[0]
    else:
        return None
    column = lines[line].index("\t") + 1
    return (f"{path}, line {line + 1}, column {column}: a tab character, which YAML does not "
            f"allow in indentation or between a key and its value -- indent with spaces")
