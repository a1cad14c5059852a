"""How a paper's payloads and replies travel as Message-API records, written once.

Both halves of the spike (:mod:`.server_app`, :mod:`.client_app`) import these, so a key
is spelled in one place:

* an instruction is ``RecordDict({"arrays": ArrayRecord(list of arrays), "config":
  ConfigRecord(flat config)})`` -- the arrays a legacy strategy's ``fit_payload`` /
  ``eval_payload`` return (in order: ``ArrayRecord`` keys ``"0"``, ``"1"``, ...), the
  config its ``base_config`` builds from the typed declarations of
  :mod:`flower_pfl.instructions`;
* a reply is ``RecordDict({"arrays": ..., "metrics": MetricRecord, "info": ConfigRecord})``:
  Flower's ``MetricRecord`` holds only ``int`` / ``float`` (no ``bool``, no ``str``), so a
  client's string and bool metrics (its device, the ``evaluated`` phrase) go in the
  ``info`` ConfigRecord and the two are merged back into one dict on the server.  The
  sample count is the metric ``num-examples`` (Flower's own strategies weight by that key);
  an evaluation's loss is the metric ``loss``.

Errors: :class:`RecordError` names the record or key a reply lacks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

ARRAYS, CONFIG, METRICS, INFO = "arrays", "config", "metrics", "info"
NUM_EXAMPLES, LOSS = "num-examples", "loss"
#: the query a server sends to learn a node's partition-id, and the key of the answer
HANDSHAKE = "partition-id"


class RecordError(ValueError):
    """A reply without a record or key the spike's protocol requires."""


def instruction(arrays: Sequence[np.ndarray], config: Mapping[str, Any]) -> RecordDict:
    """The content of one train / evaluate message (arrays in order, the flat config)."""
    return RecordDict({ARRAYS: ArrayRecord([np.asarray(a) for a in arrays]),
                       CONFIG: ConfigRecord(dict(config))})


def read_instruction(content: RecordDict) -> tuple[list[np.ndarray], dict[str, Any]]:
    """(arrays, config) of an instruction made by :func:`instruction`."""
    return (_arrays(content), dict(_record(content, CONFIG, ConfigRecord)))


def reply(arrays: Sequence[np.ndarray], num_examples: int, metrics: Mapping[str, Any],
          loss: float | None = None) -> RecordDict:
    """A client's answer: numbers in the MetricRecord (with ``num-examples`` and, for an
    evaluation, ``loss``), strings and bools in the ``info`` ConfigRecord."""
    numbers: dict[str, int | float | list[int] | list[float]] = {NUM_EXAMPLES: int(num_examples)}
    if loss is not None:
        numbers[LOSS] = float(loss)
    info: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            numbers[k] = v.item() if isinstance(v, np.generic) else v
        else:
            info[k] = v
    return RecordDict({ARRAYS: ArrayRecord([np.asarray(a) for a in arrays]),
                       METRICS: MetricRecord(numbers), INFO: ConfigRecord(info)})


def read_reply(content: RecordDict) -> tuple[list[np.ndarray], int, dict[str, Any], float]:
    """(arrays, num_examples, metrics, loss) of a reply made by :func:`reply`; the metrics
    are the client's dict again (numbers and info merged; ``num-examples`` and ``loss``
    taken out); loss is NaN where the reply has none (a fit)."""
    numbers = dict(_record(content, METRICS, MetricRecord))
    if NUM_EXAMPLES not in numbers:
        raise RecordError(f"the reply's '{METRICS}' record has no '{NUM_EXAMPLES}' "
                          f"(it has {sorted(numbers)})")
    num_examples = int(numbers.pop(NUM_EXAMPLES))
    loss = float(numbers.pop(LOSS, float("nan")))
    info = dict(content.config_records.get(INFO, ConfigRecord()))
    return _arrays(content), num_examples, {**numbers, **info}, loss


def metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """The ``int`` / ``float`` entries of ``values`` (no bool) as a MetricRecord: what
    ``start()``'s history keeps of a strategy's aggregated metrics."""
    return MetricRecord({k: v for k, v in values.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})


def _arrays(content: RecordDict) -> list[np.ndarray]:
    return list(_record(content, ARRAYS, ArrayRecord).to_numpy_ndarrays())


def _record(content: RecordDict, name: str, kind: type) -> Any:
    if name not in content or not isinstance(content[name], kind):
        raise RecordError(f"the message has no {kind.__name__} '{name}' "
                          f"(it has {sorted(content)})")
    return content[name]
