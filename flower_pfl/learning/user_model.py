"""Your own model: ``model: package.module:factory`` with ``model-args`` (docs/own-model.md).

:func:`build_user_model` imports the factory (:func:`import_factory`: installed, on
``sys.path`` -- in a ``flwr run`` the app bundle's folder, where the launcher stages the
module -- or beside the run's config file), calls ``factory(**model_args)`` with torch's,
numpy's and ``random``'s generators seeded, and wraps the ``nn.Module`` it returns in
:class:`UserModel`: the built-ins' layer groups, ordered body first and head last, the head
as the model declares it (:func:`declared_head`) or the last layer by default.
:func:`user_model_problems` is what the preflight check asks of such a model beyond its
forward pass.  The syntax check :func:`check_factory_reference` lives in
flower_pfl/running/app_stage.py (no torch: the launcher and the config schema use it).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import inspect
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy

from flower_pfl.factory_ref import check_factory_reference
from flower_pfl.learning.layers import (
    MAX_BUILT,
    NamedLayers,
    _float_items,
    _groups,
    get_arrays,
    layer_groups,
)


class UserModelError(ValueError):
    """A user model (``model: package.module:factory``) cannot be imported, built or split."""


def search_dirs(cfg: Any) -> list[Path]:
    """Where a factory's module is looked for when it is not importable as is: the folder
    of the run's configuration file (``RunConfig.source``, when it is a file here), then
    the current folder.  In a ``flwr run`` the bundle's folder comes first (Flower puts it
    on ``sys.path``; flower_pfl/running/app_stage.py stages the module there)."""
    dirs = []
    source = getattr(cfg, "source", None)
    if isinstance(source, str) and Path(source).is_file():
        dirs.append(Path(source).resolve().parent)
    return dirs + [Path.cwd()]


def model_args(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the factory: ``model-args`` (absent or null: none)."""
    try:
        args = cfg["model-args"]
    except KeyError:
        return {}
    if args is None:
        return {}
    if not isinstance(args, Mapping):
        raise UserModelError(f"'model-args' must be a mapping of keyword arguments, got "
                             f"{type(args).__name__}")
    return dict(args)


def import_factory(reference: str, search: Sequence[str | Path] = ()) -> Callable[..., Any]:
    """The callable ``reference`` names (``package.module:factory``; dotted attributes
    allowed).  The module is imported as installed or on ``sys.path``; where its top-level
    name is not found there, the first folder of ``search`` holding ``<name>.py`` or
    ``<name>/`` is appended to ``sys.path``.  Raises UserModelError naming what failed."""
    problem = check_factory_reference(reference)
    if problem is not None:
        raise UserModelError(problem)
    module_name, _, attr = reference.partition(":")
    top = module_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        for folder in (Path(d).resolve() for d in search):
            if (folder / f"{top}.py").is_file() or (folder / top).is_dir():
                if str(folder) not in sys.path:
                    sys.path.append(str(folder))
                importlib.invalidate_caches()
                break
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = ", ".join(str(d) for d in search) or "nowhere else"
        raise UserModelError(f"model '{reference}': no module '{exc.name}' (looked in the "
                             f"installed packages, sys.path and {where})") from exc
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import: say so
        raise UserModelError(f"model '{reference}': importing '{module_name}' failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserModelError(f"model '{reference}': '{module_name}' has no attribute "
                                 f"'{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserModelError(f"model '{reference}': '{attr}' is a {type(obj).__name__}, not a "
                             f"function or class that returns a torch.nn.Module")
    return obj


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """torch's, numpy's and ``random``'s global generators seeded, all restored after."""
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def declared_head(net: nn.Module) -> list[str] | None:
    """The head ``net`` declares, as names relative to ``net`` (None: not declared).

    ``net.head`` may be a submodule (the head is that module), a name or a list of names
    (submodules and/or parameters: ``"classifier"``, ``["fc.weight", "fc.bias"]``), or a
    function returning one of those (a method ``head(self)`` or a function taking the
    model)."""
    head = getattr(net, "head", None)
    if head is None:
        return None
    if isinstance(head, nn.Module):
        return [next(n for n, m in net.named_modules() if m is head)]
    if callable(head):
        head = head() if inspect.ismethod(head) else head(net)
    if isinstance(head, str):
        return [head]
    if isinstance(head, (list, tuple)) and all(isinstance(h, str) for h in head):
        return list(head)
    raise UserModelError(f"the model's 'head' is a {type(head).__name__}: declare a "
                         f"submodule, a name or a list of names (or a function giving one)")


class UserModel(NamedLayers):
    """A user's model ``net`` (what the factory returned) with its body/head split.

    Layer groups are those of :class:`NamedLayers` (each module that holds parameters, its
    names prefixed ``net.``), ordered body first and head last, so the last
    ``len(head_groups)`` groups are the head that FedRep and PLGU-GRep keep on the client
    (:func:`~flower_pfl.learning.layers.head_split`).  ``head_groups``: the head's groups,
    one or more (the declared head, or the last group by default); ``head_problem``: why
    the declared head cannot be used (None: it can; the preflight check refuses the run
    otherwise)."""

    def __init__(self, net: nn.Module, reference: str) -> None:
        super().__init__()
        self.net = net
        self.reference = reference
        self.head_declared = declared_head(net) is not None
        self.head_problem: str | None = None
        self.head_groups: list[str] = []
        try:
            self.head_groups = self._split()
        except UserModelError as exc:
            self.head_problem = str(exc)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.net(*args, **kwargs)

    def layer_names(self) -> list[str]:
        names = super().layer_names()
        head = set(self.head_groups)
        return [n for n in names if n not in head] + [n for n in names if n in head]

    def _split(self) -> list[str]:
        names = super().layer_names()
        groups = _groups(self, names)
        if not groups:
            raise UserModelError("the model has no parameters")
        declared = declared_head(self.net)
        if declared is None:
            return [names[-1]]
        keys = [k for k, _ in _float_items(self)]
        modules = dict(self.net.named_modules())
        head: set[str] = set()
        for name in declared:
            if f"net.{name}" in keys:
                head.add(f"net.{name}")
            elif name and name in modules:
                found = {k for k in keys if k.startswith(f"net.{name}.")}
                if not found:
                    raise UserModelError(f"the declared head '{name}' holds no parameters")
                head |= found
            else:
                raise UserModelError(f"the declared head names '{name}', which is neither a "
                                     f"submodule nor a parameter of the model; its layers: "
                                     f"{[n[4:] for n in names]}")
        grouped = {keys[i] for _, idx in groups for i in idx}
        if head - grouped:
            raise UserModelError(f"the declared head holds {sorted(k[4:] for k in head - grouped)}"
                                 f" of a module without parameters: a head is whole layers")
        head_groups, split = [], []
        for name, idx in groups:
            inside = [keys[i] in head for i in idx]
            if all(inside):
                head_groups.append(name)
            elif any(inside):
                split.append(name[4:])
        if split:
            raise UserModelError(f"the declared head overlaps the body: layer(s) {split} are "
                                 f"partly in the head (a layer's weight, bias and statistics "
                                 f"travel together: declare whole layers)")
        if len(head_groups) == len(groups):
            raise UserModelError("the declared head is the whole model: the body is empty, "
                                 "nothing would be shared")
        return head_groups


def _tensor_problems(net: nn.Module, reference: str) -> None:
    """UserModelError for parameters every strategy cannot ship: lazy ones (no shape yet)
    and non-floating-point ones (they would never leave the client)."""
    lazy = [n for n, p in net.named_parameters() if is_lazy(p)]
    if lazy:
        raise UserModelError(f"model '{reference}': parameter(s) {lazy} are lazy (shape known "
                             f"only after a first forward pass); every strategy ships arrays "
                             f"of fixed shapes (pFedHN's hypernetwork outputs exactly them): "
                             f"give the layer its input size")
    other = [f"{n} ({p.dtype})" for n, p in net.named_parameters() if not p.is_floating_point()]
    if other:
        raise UserModelError(f"model '{reference}': parameter(s) {other} are not floating "
                             f"point: only float arrays travel between server and clients")


#: seeded user models built once per process, keyed like :data:`_BUILT`
_BUILT_USER: dict[tuple[str, str, tuple[int, ...], int, int], UserModel] = {}


def build_user_model(reference: str, args: Mapping[str, Any], in_shape: Sequence[int],
                     num_classes: int, seed: int, search: Sequence[str | Path] = ()
                     ) -> UserModel:
    """``factory(**args)`` (:func:`import_factory`) with torch's, numpy's and ``random``'s
    generators seeded by ``seed``, wrapped in :class:`UserModel`; cached per process and
    returned as a deep copy, as :func:`build_model` does.  ``in_shape``/``num_classes``
    only key the cache (the factory gets ``args`` alone; the preflight check compares its
    output size with the classes).  Raises UserModelError: the factory cannot be found or
    raises, returns no ``nn.Module``, or has lazy or non-float parameters."""
    key = (reference, json.dumps(dict(args), sort_keys=True, default=str),
           tuple(int(d) for d in in_shape), int(num_classes), int(seed))
    built = _BUILT_USER.get(key)
    if built is None:
        factory = import_factory(reference, search)
        with _seeded(int(seed)):
            try:
                net = factory(**dict(args))
            except Exception as exc:  # noqa: BLE001 - the user's code: name it and its args
                raise UserModelError(f"model '{reference}': the factory called with "
                                     f"model-args {dict(args)} raised {type(exc).__name__}: "
                                     f"{exc}") from exc
            if not isinstance(net, nn.Module):
                raise UserModelError(f"model '{reference}': the factory returned a "
                                     f"{type(net).__name__}, not a torch.nn.Module")
            _tensor_problems(net, reference)
            built = UserModel(net, reference)
        if len(_BUILT_USER) >= MAX_BUILT:
            _BUILT_USER.clear()
        _BUILT_USER[key] = built
    return copy.deepcopy(built)


def user_model_problems(model: UserModel, rebuild: Callable[[], NamedLayers],
                        batch: torch.Tensor, one_sample_batches: int, strategy: str,
                        one_head: bool, hidden: int | None) -> list[str]:
    """What the preflight check asks of a factory's ``model`` beyond one forward pass, one
    line per problem: ``rebuild()`` after the cache is cleared gives the weights it gave
    before; where ``one_sample_batches`` > 0 clients train a last batch of 1 sample, the
    model takes one in training mode (BatchNorm does not).  The ``strategy``'s needs:
    ``one_head`` (FedRep, PLGU-GRep keep the declared head -- its layer groups, one or
    several -- on the client and share the rest): no float state outside every layer group
    (a module with buffers but no parameters: neither head nor body, reset each round);
    ``hidden`` (pFedHN,
    PLGU-GHN): the hypernetwork's output layer, ``hidden`` x D floats with its gradient and
    the round's sum (3 copies), fits this machine's memory."""
    name = model.reference
    problems = []
    cached = rebuild()  # the build this process keeps (``model`` may have run a batch)
    _BUILT_USER.clear()
    again = rebuild()
    if any(not np.array_equal(a, b) for a, b in zip(get_arrays(cached), get_arrays(again))):
        problems.append(f"model '{name}': two builds with the same seed give different weights "
                        f"(a generator other than torch's, numpy's or random's?); every node "
                        f"builds the model, so the factory must be seeded")
    if one_sample_batches:
        try:
            with torch.no_grad():
                copy.deepcopy(model).train()(batch[:1])
        except Exception as exc:  # noqa: BLE001 - e.g. BatchNorm: a batch of one in training
            problems.append(f"model '{name}' fails on a batch of 1 sample in training ({exc}), "
                            f"and {one_sample_batches} client(s) train a last batch of 1: set "
                            f"train.drop-last: true or change train.batch-size")
    grouped = {i for _, idx in layer_groups(model) for i in idx}
    loose = [k[4:] for i, (k, _) in enumerate(_float_items(model)) if i not in grouped]
    if loose and one_head:
        problems.append(f"model '{name}': {loose} belong to a module without parameters (e.g. "
                        f"BatchNorm with affine=False): {strategy} would reset them each round "
                        f"(neither head nor body); give the module parameters")
    if hidden is not None:
        dim = sum(a.size for a in get_arrays(model))
        need = 3 * 4 * hidden * dim
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if need > have:
            problems.append(f"model '{name}': {strategy}'s hypernetwork outputs all {dim} float "
                            f"entries of the model: its output layer needs {need / 2**30:.1f} "
                            f"GiB (hidden = {hidden} x {dim} floats, 3 copies), over this "
                            f"machine's {have / 2**30:.1f} GiB; lower hyper.{strategy}.hidden "
                            f"or use a smaller model")
    return problems
