"""The syntax of a model factory reference, ``package.module:factory`` (docs/own-model.md).
Standard library only: the config check, the app stage and the model builder share it, and
none of them imports the user's module or torch to read it."""

from __future__ import annotations

import keyword
import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_factory_reference(value: object) -> str | None:
    """Why ``value`` is not a model factory reference ``package.module:factory`` (None: it
    is one).  Syntax only -- Python names joined by dots, one ``:`` before the factory
    (which may be dotted too: ``mod:Class.build``) -- nothing is imported."""
    if not isinstance(value, str):
        return f"a factory reference is text 'package.module:factory', got {value!r}"
    module, sep, attr = value.partition(":")
    parts = module.split(".") + attr.split(".")
    if sep and all(_NAME.fullmatch(p) and not keyword.iskeyword(p) for p in parts):
        return None
    return (f"'{value}' is not a factory reference: write 'module:factory' or "
            f"'package.module:factory' (Python names, one ':' before the function)")
