"""The state every part of a strategy shares, declared once with its types.

``PersonalizedStrategy`` (:mod:`.base`) is assembled from mixins -- :class:`~.nodes.
NodeTracking`, :class:`~.payloads.FitPayloads`, :class:`~.uploads.UploadAcceptance`,
:class:`~.private_round.PrivateRound`, :class:`~.round_records.RoundRecords`,
:class:`~.evaluation.EvaluationReporting`, :class:`~.checkpointing.Checkpointing` -- that
read and write the attributes its ``__init__`` sets and call each other's methods.
:class:`StrategyState` is their common base: the attributes' types (class annotations
only: nothing is set here, ``PersonalizedStrategy.__init__`` sets each one; ``hasattr`` of
an attribute it has not set stays False, as the checkpoint's allow-list check needs),
three read-only views of them (``spec``, ``initial_model``, ``round_server_log``) and, for
the type checker only, the methods one mixin calls on another.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:  # types only: importing this module stays as cheap as before
    from flwr.common import Scalar
    from flwr.server.client_manager import ClientManager
    from flwr.server.client_proxy import ClientProxy

    from flower_pfl.config import RunConfig
    from flower_pfl.contract import Entry, Mechanism
    from flower_pfl.learning.params import ParamSpec
    from flower_pfl.privacy.server_side import ClientLevelDP
    from flower_pfl.reliability.uploads import UploadTemplate
    from flower_pfl.reporting.results import ResultsWriter
    from flower_pfl.strategies.federation import ClientStore
from flower_pfl.strategies.mechanism import MechanismCount


class StrategyState:
    """The attributes of a ``PersonalizedStrategy`` (set in its ``__init__``) and the methods
    its mixins call on one another (declared for the type checker only)."""

    # -- class attributes (each strategy class may set its own value) ----------------
    #: whether the strategy maintains a global model that clients also evaluate
    has_global_model: bool
    #: what the strategy's own mechanism is (None: nothing to count; mechanism.py)
    mechanism: Mechanism | None
    #: whether clients upload a model, and whether uploads stay serialised until read
    #: (uploads.py)
    uploads_model: bool
    lazy_uploads: bool

    # -- the run ---------------------------------------------------------------------
    cfg: RunConfig
    #: the strategy's hyper-parameters (``cfg.hyper``, the registry's defaults filled in)
    hyper: dict[str, Any]
    num_clients: int
    #: the sampling generator (seeded by the run's seed; checkpointed)
    rng: np.random.Generator
    cfg_json: str
    #: whether every message carries the configuration (``cfg_json``)
    cfg_travels: bool
    run_uid: str
    #: the first round this process runs (> 1 after a resume)
    start_round: int
    #: the per-client metric's name and whether lower is better (metric_kind.py)
    metric: str
    lower_is_better: bool
    #: keys of the warnings already given (``warn_once``)
    warned: set[Any]

    # -- the federation (nodes.py) -----------------------------------------------------
    #: the paper's contract (its newcomer rule: ``entry.newcomer``)
    entry: Entry
    #: the held-out newcomers' partition-ids (flower_pfl/newcomers.py): never sampled
    newcomers: list[int]
    #: Flower's node id -> partition-id, and partition-id -> the node's current proxy
    pid_of_cid: dict[str, int]
    proxies: dict[int, ClientProxy]
    _federation_checked: bool

    # -- the model and the per-client state ------------------------------------------
    store: ClientStore
    _initial: list[np.ndarray] | None
    global_arrays: list[np.ndarray] | None
    #: the model's layout (set by ``initialize_parameters``; base.py's ``spec`` reads it)
    #: and the upload's model part's
    _spec: ParamSpec | None
    upload_spec: ParamSpec | None
    #: what each sampled client was sent this round (flattened: the norm check; as
    #: arrays: clipping under DP)
    _sent: dict[int, np.ndarray]
    _sent_arrays: dict[int, list[np.ndarray]]

    # -- records (evaluation.py, checkpointing.py) -----------------------------------
    results: ResultsWriter
    eval_history: list[dict[str, float]]
    _round_server_log: dict[str, Any]
    mechanism_count: MechanismCount
    ray_cluster_said: bool
    #: the clients' state folder (simulation: set by the ServerApp; None: not mirrored)
    client_state_dir: Path | None
    _restored: bool

    # -- privacy -----------------------------------------------------------------------
    privacy_mode: str
    dp: ClientLevelDP | None

    # -- read-only views ----------------------------------------------------------------
    @property
    def spec(self) -> ParamSpec:
        """The model's layout (its arrays' shapes and dtypes, ``dim`` floats in all), set by
        ``initialize_parameters``; RuntimeError before."""
        if self._spec is None:
            raise RuntimeError(f"{type(self).__name__}.spec is read before "
                               f"initialize_parameters set the model")
        return self._spec

    @property
    def initial_model(self) -> list[np.ndarray] | None:
        """The round-0 model arrays (given, or built from the config by
        ``initialize_parameters``)."""
        return self._initial

    @property
    def round_server_log(self) -> Mapping[str, Any]:
        """What ``log_server`` recorded in this round so far (its server.csv row)."""
        return self._round_server_log

    if TYPE_CHECKING:  # implemented by the mixins; declared for the checker
        def handshake(self, client_manager: ClientManager) -> None: ...  # nodes.py

        def proxy_pid(self, proxy: ClientProxy) -> int: ...  # nodes.py

        def base_config(self, server_round: int, extra: Mapping[str, Scalar],
                        pid: int | None = None) -> dict[str, Scalar]: ...  # payloads.py

        def record_failures(self, server_round: int, phase: str, failures: list[Any]
                            ) -> list[tuple[int, str]]: ...  # uploads.py

        def clip_upload(self, pid: int, arrays: list[np.ndarray], template: UploadTemplate,
                        max_norm: float | None) -> list[np.ndarray]: ...  # private_round.py

        def log_server(self, **values: Any) -> None: ...  # round_records.py

        def budget_exhausted_after(self, server_round: int) -> bool: ...

        def save_checkpoint(self, server_round: int) -> Path: ...
