"""The tuned engine's gate: the versions it was tested on, and what of Flower's it touches.

Every replacement in :mod:`flower_pfl.tuned` declares, as :class:`Need` s, each name of
Flower's (or Ray's) that it replaces, wraps or reads, private ones included: that it is
there (``present``), that a function's code names an attribute (``names``: an instance
attribute its ``__init__`` sets, a function the engine looks up by name when it starts a
thread), a signature (``params``), and -- where ours re-implements the body of a Flower
function -- that the function is the one ours was written from (``body``: the SHA-256 of
its source, :func:`fingerprint`).  :func:`unmet` checks a list of them before anything is
replaced (:func:`flower_pfl.tuned.switch.install`): one unmet need and the whole engine
stays Flower's, before the run starts -- never a missing attribute in Flower's engine
thread mid-run.

:data:`TESTED` is the version gate: the Flower and Ray release series the tuned engine was
tested on (Flower 1.42 pins Ray 2.55.1 for its simulation extra).  Outside them
(:func:`outside_tested`), Flower runs as released.  Imports nothing of Flower at import.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import textwrap
from dataclasses import dataclass
from types import CodeType
from typing import Any, Callable, Mapping

#: distribution -> the release series (major.minor) the tuned engine was tested on; a
#: distribution that is not installed is not gated (no Ray: no Ray backend to tune)
TESTED: dict[str, str] = {"flwr": "1.42", "ray": "2.55"}

#: the kinds of :class:`Need`
KINDS = ("present", "names", "params", "body")


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (``importlib.metadata``), None when it
    is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def series(version: str) -> str:
    """``"1.42"`` of ``"1.42.0"`` / ``"1.42.1rc1"``: the major.minor release series."""
    return ".".join(version.split(".")[:2])


def outside_tested(version_of: Callable[[str], str | None] = installed_version,
                   tested: Mapping[str, str] | None = None) -> str | None:
    """``"flwr 1.43.0 (tested: 1.42.x)"`` -- each installed distribution of ``tested``
    (default :data:`TESTED`) whose version is outside its series, joined by ``"; "`` --
    or None when every one is inside (or not installed)."""
    out = []
    for dist, want in (TESTED if tested is None else tested).items():
        have = version_of(dist)
        if have is not None and series(have) != want:
            out.append(f"{dist} {have} (tested: {want}.x)")
    return "; ".join(out) or None


def locate(where: str) -> tuple[Any, str]:
    """``(owner, name)`` of ``"module:Owner.name"`` (or ``"module:name"``: the module is the
    owner): the object that holds the name, imported.  Raises ``ImportError`` or
    ``AttributeError`` when the module or an owner on the way is not there."""
    module, _, dotted = where.partition(":")
    *path, name = dotted.split(".")
    owner: Any = importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def fingerprint(fn: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``fn``'s source (``inspect.getsource``,
    dedented): equal for the same source text, whatever the Python version.  Raises
    ``OSError`` / ``TypeError`` where the source cannot be read."""
    source = textwrap.dedent(inspect.getsource(fn))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _code_names(code: CodeType) -> set[str]:
    """The names a code object (and the functions and comprehensions nested in it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _code_names(const)
    return names


@dataclass(frozen=True)
class Need:
    """One thing of Flower's (or Ray's) a replacement relies on.

    ``where``: ``"module:Owner.name"`` (or ``"module:name"``); a property stands for its
    getter.  ``kind`` (one of :data:`KINDS`) and ``value``: ``present`` (none), ``names``
    (an attribute or global the function's code uses, e.g. ``"lock"`` for an ``__init__``
    that sets ``self.lock``), ``params`` (the parameter names, comma-separated, e.g.
    ``"self,message"``), ``body`` (its :func:`fingerprint`)."""

    where: str
    kind: str = "present"
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Need.kind must be one of {KINDS}, not {self.kind!r}")

    @property
    def short(self) -> str:
        """``vce_api.add_messages_to_queue``: the module's last part and the name."""
        module, _, name = self.where.partition(":")
        return f"{module.rsplit('.', 1)[-1]}.{name}"

    def resolve(self) -> Any:
        """The object named by ``where`` (a property: its getter).  Raises ``ImportError``
        or ``AttributeError`` when it is not there."""
        owner, name = locate(self.where)
        obj = getattr(owner, name)
        return obj.fget if isinstance(obj, property) else obj

    def unmet(self) -> str | None:
        """Why this need is not met (``"vce_api.run_api: does not use add_messages_to_queue"``),
        None when it is.  Checked before ours is installed (ours in place would not be
        Flower's body)."""
        try:
            obj = self.resolve()
        except (ImportError, AttributeError):
            return f"{self.short}: absent"
        if self.kind == "names":
            code = getattr(obj, "__code__", None)
            if code is None or self.value not in _code_names(code):
                return f"{self.short}: does not use {self.value}"
        elif self.kind == "params":
            try:
                have = ",".join(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                have = "?"
            if have != self.value:
                return f"{self.short}: parameters ({have}), not ({self.value})"
        elif self.kind == "body":
            try:
                same = fingerprint(obj) == self.value
            except (OSError, TypeError):
                return f"{self.short}: source unreadable"
            if not same:
                return f"{self.short}: not the body ours was written from (source changed)"
        return None


def unmet(needs: list[Need]) -> list[str]:
    """Why each unmet need of ``needs`` is not met, in order (empty: all met)."""
    return [why for why in (need.unmet() for need in needs) if why is not None]
