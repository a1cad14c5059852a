"""The run checked before anything starts: this machine, the folders, the data, the model.

Two stages, each refusal one line that names the setting (``'device' = 'cuda': ...``):

1. :func:`check_before_start` judges what needs no data (no torch but the CUDA probe):
   this machine can host the clients (:func:`machine_problems`: ``device: cuda`` and
   ``client-resources.num-gpus`` need a CUDA device torch can use; ``num-cpus`` at most the
   machine's cores, else Ray places no client and Flower stops with "ActorPool is empty");
   TensorBoard is installed where ``tracking`` asks for it (:func:`tracking_problems`);
   the folders a run writes can be written (:func:`path_problems`: the results folder,
   ``tracking-dir``, ``cache-dir`` -- judged without creating anything, so a refused run
   leaves no folder); the data sizes fit the clients (:func:`size_problems`:
   ``data.subsample`` against ``clients`` and ``data.min-samples``).
2. :func:`preflight`: stage 1, then the dataset files load, the partition leaves every
   client a train and a test split, and the model takes the data's samples and has an
   output per class (a factory's model: :func:`check_model`, docs/own-model.md).  Only
   then is the results folder made (for the initial model).

Which machine facts apply depends on where the clients run, the ``scope``:

* ``simulation``: Ray on this machine (``flower-pfl run``, ``bench``): every check;
* ``cluster``: Ray clients on a cluster's nodes (``run --ray-address``): no device or
  resource check here (a worker may have the GPU this head lacks);
* ``deployment``: SuperNodes started on this machine (``flower-pfl deploy``): the device
  check; Ray's client resources do not apply;
* ``remote``: a SuperLink elsewhere (``flower-pfl submit``): no machine check -- the nodes
  cannot be seen from here; ``flower-pfl supernode --gpu`` checks its own device.

The launcher runs :func:`preflight` in a short-lived child process (:func:`preflight_apart`,
:mod:`~flower_pfl.reliability.preflight_apart`: torch stays out of the launcher).  Per-site
data (``data.dataset: site``): no pool, so the model is checked against the declared
``data.input-shape`` and ``data.classes`` (:func:`_site_preflight`).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, Union

from flower_pfl.child import run_python

#: where the clients run (module docstring): which machine checks apply
SCOPES = ("simulation", "cluster", "deployment", "remote")


class PreflightError(RuntimeError):
    """The run cannot start: the message names the cause (data, model, output folder)."""


class HasValues(Protocol):
    """A run configuration (config.RunConfig, which this layer does not import)."""

    @property
    def values(self) -> Mapping[str, Any]: ...


Configured = Union[HasValues, dict[str, Any]]  # a RunConfig or its values


# ------------------------------------------------------------------- this machine
@dataclass(frozen=True)
class Machine:
    """What this machine offers a simulation's clients: ``cpus`` (``os.cpu_count()``, what
    Ray counts), ``gpus`` (CUDA devices torch can use; -1: not probed) and, with none, why
    (``why_no_gpu``, from :func:`flower_pfl.learning.devices.cuda_devices`)."""

    cpus: int
    gpus: int = -1
    why_no_gpu: str = ""


def needs_cuda(values: Mapping[str, Any], scope: str = "simulation") -> bool:
    """Whether judging ``values`` in ``scope`` needs this machine's CUDA devices (only
    ``device: cuda`` or a GPU share for Ray's clients do)."""
    gpu_share = scope == "simulation" and float(values["client-resources.num-gpus"]) > 0
    return scope in ("simulation", "deployment") and (values["device"] == "cuda" or gpu_share)


def this_machine(probe_cuda: bool = True) -> Machine:
    """This process's :class:`Machine`; ``probe_cuda`` imports torch (not in a launcher:
    :func:`this_machine_apart`)."""
    cpus = os.cpu_count() or 1
    if not probe_cuda:
        return Machine(cpus)
    from flower_pfl.learning.devices import cuda_devices

    gpus, why = cuda_devices()
    return Machine(cpus, gpus, why)


_MACHINE_CHILD = ("import dataclasses, json\n"
                  "from flower_pfl.reliability.preflight import this_machine\n"
                  "print(json.dumps(dataclasses.asdict(this_machine())))\n")


def this_machine_apart(probe_cuda: bool = True, timeout_s: float = 300) -> Machine:
    """:func:`this_machine` with the CUDA probe in a child process (torch stays out of
    this one; ~2 s, so only where :func:`needs_cuda`)."""
    if not probe_cuda:
        return this_machine(False)
    done = run_python(_MACHINE_CHILD, timeout_s=timeout_s)
    try:
        return Machine(**json.loads(done.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError, TypeError) as exc:
        raise PreflightError(f"could not probe this machine's CUDA devices (exit "
                             f"{done.returncode}): {done.stderr[-2000:]}") from exc


def machine_problems(values: Mapping[str, Any], machine: Machine,
                     scope: str = "simulation") -> list[str]:
    """One line per setting this machine cannot serve in ``scope`` (pure: the machine is
    given).  Ray places a client where ``num-cpus`` cores and ``num-gpus`` of a GPU are
    free (Flower: ``floor(CPUs / num-cpus)``, with GPUs ``min(that, floor(GPUs /
    num-gpus))`` actors, none without a GPU)."""
    if scope not in SCOPES:
        raise ValueError(f"scope {scope!r}: one of {SCOPES}")
    problems = []
    no_gpu = machine.gpus == 0
    if scope in ("simulation", "deployment") and values["device"] == "cuda" and no_gpu:
        problems.append(f"'device' = 'cuda': {machine.why_no_gpu or 'no CUDA device'} on this "
                        f"machine; set device: auto (CUDA where there is one) or cpu")
    if scope != "simulation":
        return problems
    share = float(values["client-resources.num-gpus"])
    if share > 0 and no_gpu:
        problems.append(f"'client-resources.num-gpus' = {share:g}: "
                        f"{machine.why_no_gpu or 'no CUDA device'} on this machine, so Ray "
                        f"can place no client (Flower: 'ActorPool is empty'); set it to 0")
    elif share > machine.gpus > 0:
        problems.append(f"'client-resources.num-gpus' = {share:g} exceeds this machine's "
                        f"{machine.gpus} GPU(s), so Ray can place no client; set at most "
                        f"{machine.gpus}")
    cpus = int(values["client-resources.num-cpus"])
    if cpus > machine.cpus:
        problems.append(f"'client-resources.num-cpus' = {cpus} exceeds this machine's "
                        f"{machine.cpus} CPU core(s), so Ray can place no client; set at "
                        f"most {machine.cpus}")
    return problems


# ------------------------------------------------------------------------ folders
def _unwritable(path: Path) -> str | None:
    """Why a folder could not be made or written at ``path`` (None: it can), judged
    without creating it: the nearest existing folder on its way must take a file."""
    path = Path(path).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"no write permission in {existing}"
    try:
        with tempfile.TemporaryFile(dir=existing):  # a nameless file: nothing left behind
            pass
    except OSError as exc:
        return f"cannot create a file in {existing}: {exc.strerror or exc}"
    return None


def check_output_dir(results_dir: str | Path) -> None:
    """PreflightError where the results folder cannot be made or written (nothing is
    created)."""
    raise_problems(output_problems(results_dir))


def _output_problem(path: Path, why: str) -> str:
    return (f"the output directory {path} is not writable ({why}); set 'output-dir' (or "
            f"'run-name') to a folder you can write")


def output_problems(results_dir: str | Path | None) -> list[str]:
    """The line of :func:`check_output_dir` where the results folder cannot be made or
    written ([] where it can, or with no folder given)."""
    why = None if results_dir is None else _unwritable(Path(results_dir))
    return [] if why is None else [_output_problem(Path(str(results_dir)), why)]


def path_problems(values: Mapping[str, Any], results_dir: str | Path | None = None
                  ) -> list[str]:
    """One line per folder the run would write but cannot: the results folder (where
    given), ``tracking-dir`` (TensorBoard on), ``cache-dir`` (``FLOWER_PFL_CACHE`` or
    ``~/.cache/flower-pfl`` when null).  Creates nothing."""
    problems = output_problems(results_dir)
    if values.get("tracking") == "tensorboard" and values.get("tracking-dir"):
        why = _unwritable(Path(values["tracking-dir"]))
        if why is not None:
            problems.append(f"'tracking-dir' = {values['tracking-dir']}: not writable ({why}); "
                            f"set it to a folder you can write, or null (<results>/tensorboard)")
    from flower_pfl.learning.data import default_cache_dir

    cache = values.get("cache-dir")
    why = _unwritable(Path(cache) if cache else default_cache_dir())
    if why is not None:
        key = (f"'cache-dir' = {cache}" if cache else
               f"'cache-dir' = null ({default_cache_dir()}, FLOWER_PFL_CACHE or ~/.cache)")
        problems.append(f"{key}: not writable ({why}); set cache-dir to a folder you can write")
    return problems


# ---------------------------------------------------------------------- data sizes
def size_problems(values: Mapping[str, Any]) -> list[str]:
    """One line per data size that cannot give every client its samples, judged before the
    data is read: each client needs a train and a test sample (2 of the pooled samples);
    Dirichlet, ``data.min-samples`` each.  The pooled count is ``data.subsample`` or the
    dataset's size (:data:`flower_pfl.learning.data.POOLED_SIZE`; a ``data.root`` holding
    fewer is judged when the partition is made).  A ``natural`` or ``file`` partition lists
    every client's samples itself (a file may let clients share them: ``"overlap": true``),
    so no count of distinct samples applies: the partition's own checks (every client
    present and non-empty) run when it is read."""
    from flower_pfl.learning.data import POOLED_SIZE

    dataset = values["data.dataset"]
    if dataset not in POOLED_SIZE:  # the synthetic task: samples per client, no pool
        return []
    if values["data.partition"] in ("natural", "file"):
        return []
    clients, sub = int(values["clients"]), values["data.subsample"]
    pooled = min(int(sub), POOLED_SIZE[dataset]) if sub else POOLED_SIZE[dataset]
    key = f"'data.subsample' = {sub}" if sub and sub < POOLED_SIZE[dataset] else \
        f"'clients' = {clients} ({dataset} has {POOLED_SIZE[dataset]} samples)"
    need = 2 * clients
    if values["data.partition"] == "dirichlet":
        need = max(need, clients * int(values["data.min-samples"]))
    if pooled >= need:
        return []
    why = ("a train and a test sample each" if need == 2 * clients else
           f"'data.min-samples' = {values['data.min-samples']} each (Dirichlet)")
    fix = (f"raise data.subsample to at least {need} or lower 'clients'" if key[1:5] == "data"
           else "lower 'clients'")
    if need > 2 * clients:
        fix += " or 'data.min-samples'"
    return [f"{key} cannot give {clients} clients {why}: {need} samples needed; {fix}"]


def start_problems(values: Mapping[str, Any], scope: str = "simulation",
                   results_dir: str | Path | None = None, machine: Machine | None = None
                   ) -> list[str]:
    """Every problem of stage 1 (module docstring), one line each; ``machine`` defaults
    to :func:`this_machine` (the CUDA probe in-process, only where :func:`needs_cuda`).
    Scope ``remote`` judges no folder here either (the SuperLink's and nodes' are theirs)."""
    if machine is None:
        machine = this_machine(needs_cuda(values, scope))
    here = [] if scope == "remote" else tracking_problems(values) + path_problems(values,
                                                                               results_dir)
    return machine_problems(values, machine, scope) + here + size_problems(values)


def tracking_problems(values: Mapping[str, Any]) -> list[str]:
    """The line for ``tracking: tensorboard`` without the TensorBoard package here (the
    ServerApp writes the events; judged without importing torch or TensorBoard)."""
    import importlib.util

    if values.get("tracking") != "tensorboard" or importlib.util.find_spec("tensorboard"):
        return []
    return ["'tracking' = 'tensorboard': the TensorBoard package is not installed here: pip "
            "install 'flower-pfl[tensorboard]' (or pip install tensorboard), or set "
            "tracking: none"]


def check_before_start(cfg: Configured, scope: str = "simulation",
                       results_dir: str | Path | None = None,
                       machine: Machine | None = None) -> None:
    """Stage 1 (module docstring) from a launcher: the CUDA probe, where needed, in a
    child (:func:`this_machine_apart`).  Raises PreflightError whose message is the one
    problem's line, or ``N settings cannot work here:`` and a line per problem."""
    values = cfg if isinstance(cfg, dict) else cfg.values
    if machine is None:
        machine = this_machine_apart(needs_cuda(values, scope))
    raise_problems(start_problems(values, scope, results_dir, machine))


def raise_problems(problems: list[str]) -> None:
    """PreflightError of ``problems`` (one: its line; several: a line each); none: return."""
    if len(problems) == 1:
        raise PreflightError(problems[0])
    if problems:
        raise PreflightError(f"{len(problems)} settings cannot work here:\n  - "
                             + "\n  - ".join(problems))


# ------------------------------------------------------------------------ preflight
def preflight(cfg: Configured, results_dir: str | Path | None = None,
              initial_out: str | Path | None = None, scope: str = "simulation",
              hyper: Mapping[str, Any] | None = None, search: Sequence[str] | None = None
              ) -> None:
    """Everything that can be checked before training starts, each with a clear message:
    stage 1 (:func:`start_problems` in ``scope``; the CUDA probe in this process), the
    dataset files, every client's train and test split, and the model against the data
    and the strategy (:func:`check_model`).  Creates nothing until every check has
    passed; then, with ``initial_out``, the run's initial model is written there (its
    folder made) for the ServerApp (:func:`flower_pfl.initial_model.write`; not for the
    synthetic task, whose model has nothing to check).  ``hyper``: the strategy's
    hyper-parameters (default: ``cfg.hyper``, else the registry's); ``search``: where a
    factory's module is looked for (default: ``learning.models.search_dirs(cfg)``).
    Raises PreflightError."""
    values = cfg if isinstance(cfg, dict) else cfg.values
    raise_problems(start_problems(values, scope, results_dir))
    from flower_pfl.learning import data as data_mod
    from flower_pfl.learning.partitions import get_partition

    if values["data.dataset"] == "synthetic-gaussian":
        return
    if values["data.dataset"] == "site":
        return _site_preflight(cfg, values, initial_out, hyper, search)
    import numpy as np

    from flower_pfl.learning import own_data, splits

    try:
        x, y = data_mod.load_pooled(values["data.dataset"], values["data.root"],
                                    values.get("cache-dir"), own_data.settings_of(values))
        part = get_partition(values, y)
    except data_mod.DataError as exc:
        raise PreflightError(str(exc)) from exc
    unseen = splits.unseen_test_classes(part.train, part.test, np.asarray(y))
    if unseen:
        warnings.warn(f"{len(unseen)} of {len(part.train)} clients test on classes their "
                      f"training set lacks (clients {sorted(unseen)[:10]}); data.split = "
                      f"{values.get('data.split')!r}", UserWarning, stacklevel=2)
    for pid, (tr, te) in enumerate(zip(part.train, part.test)):
        if len(tr) == 0 or len(te) == 0:
            raise PreflightError(f"the partition leaves client {pid} with {len(tr)} training and "
                                 f"{len(te)} test sample(s); lower 'clients', raise "
                                 f"'data.subsample' or change 'data.test-fraction'")
    from flower_pfl.learning.user_model import search_dirs

    if search is None:
        search = [str(d) for d in search_dirs(cfg)]
    if hyper is None:
        hyper = getattr(cfg, "hyper", None)
    batch = data_mod.to_tensor(x[part.train[0][:max(2, int(values["train.batch-size"]))]],
                               values["data.dataset"])
    sizes = [len(tr) for tr in part.train]
    check_model(values, hyper, search, batch, int(y.max()) + 1, sizes)
    if initial_out is not None:
        from flower_pfl import initial_model

        Path(initial_out).parent.mkdir(parents=True, exist_ok=True)
        initial_model.write(initial_out, values)


def _site_preflight(cfg: Configured, values: Mapping[str, Any], initial_out: Any,
                    hyper: Mapping[str, Any] | None, search: Sequence[str] | None) -> None:
    """:func:`preflight` of per-site data (``data.dataset: site``): no pool to read, so the
    model is checked on a batch of the declared ``data.input-shape`` (zeros) against the
    declared ``data.classes`` (the config's checks refused a run without them); each site
    checks its own data when its node loads it (:mod:`flower_pfl.learning.site_data`)."""
    import torch

    from flower_pfl.learning import site_data
    from flower_pfl.learning.user_model import search_dirs

    info = site_data.register(values)
    batch = torch.zeros((max(2, int(values["train.batch-size"])), *info.shape))
    search = [str(d) for d in search_dirs(cfg)] if search is None else search
    check_model(values, getattr(cfg, "hyper", None) if hyper is None else hyper, search,
                batch, info.num_classes, [])
    if initial_out is not None:
        from flower_pfl import initial_model

        Path(initial_out).parent.mkdir(parents=True, exist_ok=True)
        initial_model.write(initial_out, values)


def check_model(values: Mapping[str, Any], hyper: Mapping[str, Any] | None,
                search: Sequence[str], batch: Any, labels: int, train_sizes: Sequence[int]
                ) -> None:
    """PreflightError where the configured model cannot be built (a factory: UserModelError,
    or a head that cannot be used), one forward pass on ``batch`` (samples ``(B, *input)``)
    fails or gives no ``(B, classes)`` tensor (a factory's: exactly the dataset's classes;
    a built-in: at least ``labels``), under sample-level DP the model cannot take one
    DP-SGD step (:func:`~flower_pfl.reliability.dp_preflight.dp_step_problem`: BatchNorm,
    in-place activations, anything opacus raises), or a factory's model fails
    :func:`~flower_pfl.learning.user_model.user_model_problems` (``train_sizes``: each
    client's training samples; the strategy's needs: :func:`strategy_needs`)."""
    import torch

    from flower_pfl.learning import models
    from flower_pfl.learning import user_model as um
    from flower_pfl.learning.data import NUM_CLASSES

    name, dataset = values["model"], values["data.dataset"]
    try:
        model = models.model_for(values, search)
    except um.UserModelError as exc:
        raise PreflightError(str(exc)) from exc
    except (ValueError, TypeError, RuntimeError) as exc:  # a built-in that cannot take them
        if batch.dim() == 2:  # a table's samples: features, no image
            raise PreflightError(f"model '{name}' needs images (channels, height, width) but "
                                 f"dataset '{dataset}' gives samples of {batch.shape[1]} "
                                 f"features: use model 'mclr' or 'dnn'") from exc
        raise PreflightError(f"model '{name}' does not fit dataset '{dataset}': it cannot be "
                             f"built for samples of shape {tuple(batch.shape[1:])} ({exc}); "
                             f"images need 'cnn' or 'resnet18' (or 'mclr'/'dnn'), a table "
                             f"'mclr' or 'dnn'") from exc
    own = isinstance(model, um.UserModel)
    if isinstance(model, um.UserModel) and model.head_problem is not None:
        raise PreflightError(f"model '{name}': {model.head_problem}")
    try:
        with torch.no_grad():
            out = model(batch)
    except Exception as exc:  # noqa: BLE001 - any failure means the shapes do not match
        raise PreflightError(f"model '{name}' does not fit dataset '{dataset}': samples of "
                             f"shape {tuple(batch.shape[1:])} fail in the model ({exc})") from exc
    if not isinstance(out, torch.Tensor):
        raise PreflightError(f"model '{name}' returns a {type(out).__name__}; the clients' "
                             f"loss needs one tensor of class scores (batch, classes)")
    classes = NUM_CLASSES[dataset] if own else labels
    if out.ndim != 2 or out.shape[0] != len(batch) or out.shape[1] < classes \
            or (own and out.shape[1] != classes):
        raise PreflightError(f"model '{name}' gives {tuple(out.shape[1:])} outputs per sample "
                             f"but dataset '{dataset}' has {classes} classes")
    if values.get("privacy.mode") == "sample-level":  # the run's model takes a DP-SGD step
        from flower_pfl.reliability.dp_preflight import dp_step_problem

        raise_problems([p for p in [dp_step_problem(model, batch, out.shape[1], values)] if p])
    if not isinstance(model, um.UserModel):
        return
    size, drop = int(values["train.batch-size"]), bool(values["train.drop-last"])
    ones = sum(1 for n in train_sizes if n == 1 or (n % size == 1 and not drop))
    one_head, hidden = strategy_needs(values, hyper)
    raise_problems(um.user_model_problems(model, lambda: models.model_for(values, search),
                                          batch, ones, values["strategy"], one_head, hidden))


def strategy_needs(values: Mapping[str, Any], hyper: Mapping[str, Any] | None
                   ) -> tuple[bool, int | None]:
    """What the run's strategy needs of a model: (one head layer: FedRep and PLGU-GRep
    keep exactly the last layer group on the client; the hypernetwork's ``hidden`` width
    for pFedHN and PLGU-GHN, else None)."""
    from flower_pfl import registry
    from flower_pfl.catalog.plgu import PFedHNParams

    # the classes by their registered names: this floor asks the registry, it does not
    # import the strategies' floor above it
    fedrep, pfedhn = registry.strategy_class("fedrep"), registry.strategy_class("pfedhn")
    strategy = values["strategy"]
    cls = registry.strategy_class(strategy)
    hyper = dict(registry.get(strategy).validate_hyper({}, strategy)[0], **(hyper or {}))
    params = registry.get(strategy).params.read(hyper) if issubclass(cls, pfedhn) else None
    hidden = params.hidden if isinstance(params, PFedHNParams) else None
    return issubclass(cls, fedrep), hidden

