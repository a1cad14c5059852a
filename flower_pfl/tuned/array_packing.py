"""A deployed message's arrays in one object: one HTTP request per message part, not per array.

Flower 1.42 moves a message between processes as a tree of objects
(``flwr/supercore/inflatable``): the Message, its RecordDict, each record, and under an
ArrayRecord each Array and each of its chunks (<= ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``,
5 MiB).  Every object is one HTTPS request to the SuperLink (pushed by the sender, pulled by
the receiver; at most 2 at a time per process on this 2-core machine) and, there, rows of
its SQLite object store.  The CNN's 8 tensors make a fit message of 20 objects (ResNet-18's
62: ~130); traced (docs/deployment.md), moving them was most of a tuned deployed step.

Packing (this module), in a deployment's ServerApp with ``engine: tuned``: before
``HttpGrid.push_messages`` every ArrayRecord of two or more Arrays in a message's content is
replaced by an ArrayRecord of one Array, :data:`KEY`, whose bytes are

    uint64 little-endian n | n bytes of JSON [[key, dtype, shape, stype, size], ...] |
    each Array's ``data``, in the record's order

(:func:`pack_bytes`; ``dtype`` :data:`DTYPE`, ``stype`` :data:`STYPE`), so a CNN message is 6
objects.  Nothing is converted: each Array's own ``dtype``, ``shape``, ``stype`` and ``data``
bytes are carried as they are and :func:`unpack_record` rebuilds the same Arrays, in the
same order, bit for bit.  The ClientApp's :func:`client_mod` unpacks what arrives packed
before anything of ours reads it and packs its reply only when the request came packed, so
the ServerApp alone decides (``engine: stock``, a simulation, ``FLOWER_PFL_FLOWER_ARRAYS=1``:
nothing packed, the mod passes messages through untouched); the ServerApp unpacks the
replies after ``HttpGrid.pull_messages``.  Both halves come from one FAB, so both always
know the format; an unknown :data:`STYPE` version is refused, naming it.

Installed by :func:`flower_pfl.tuned.switch.install` (a deployment's ServerApp) after
:data:`NEEDS` are met.  No Flower import at module level.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Callable, Iterable, Sequence

from flower_pfl.tuned.gate import Need
from flower_pfl.tuned.patch import Replaced

#: set to 1 to keep Flower's one object per array in a deployment
KEEP_FLOWER_ENV = "FLOWER_PFL_FLOWER_ARRAYS"
#: the one key of a packed ArrayRecord
KEY = "flower_pfl.packed"
#: the packed Array's serialization type (its version: a reader refuses another)
STYPE = "flower_pfl.packed/1"
#: the packed Array's dtype field (raw bytes)
DTYPE = "bytes"

_GRID = "flwr.superlink.grid.http_grid:HttpGrid"
#: what of Flower's :func:`install` wraps (flower_pfl/tuned/gate.py)
NEEDS = [
    Need(f"{_GRID}.push_messages", "params", "self,messages"),
    Need(f"{_GRID}.pull_messages", "params", "self,message_ids"),
    Need("flwr.app:Array.__init__", "params",
         "self,args,dtype,shape,stype,data,ndarray,torch_tensor"),
]

_HEADER = struct.Struct("<Q")

Entry = tuple[str, str, tuple[int, ...], str, bytes]  # key, dtype, shape, stype, data


def pack_bytes(entries: Sequence[Entry]) -> bytes:
    """One byte string holding ``entries`` (key, dtype, shape, stype, data), in order: the
    module docstring's layout."""
    header = json.dumps([[k, d, list(s), t, len(b)] for k, d, s, t, b in entries],
                        separators=(",", ":")).encode()
    return b"".join([_HEADER.pack(len(header)), header, *(e[4] for e in entries)])


def unpack_bytes(blob: bytes) -> list[Entry]:
    """The entries :func:`pack_bytes` packed, in order.  Raises ``ValueError`` when the
    sizes in the header do not add up to the bytes after it."""
    (n,) = _HEADER.unpack_from(blob)
    start = _HEADER.size + n
    out: list[Entry] = []
    for key, dtype, shape, stype, size in json.loads(blob[_HEADER.size:start]):
        out.append((key, dtype, tuple(shape), stype, bytes(blob[start:start + size])))
        start += size
    if start != len(blob):
        raise ValueError(f"packed arrays: {len(blob)} bytes, the header accounts for {start}")
    return out


def is_packed(record: Any) -> bool:
    """True for an ArrayRecord :func:`pack_record` made (its one key :data:`KEY`)."""
    return list(record.keys()) == [KEY]


def pack_record(record: Any) -> Any:
    """An ArrayRecord of one Array (:data:`KEY`) holding every Array of ``record`` (an
    ArrayRecord of two or more; returned as it is otherwise)."""
    from flwr.app import Array, ArrayRecord

    if len(record) < 2:
        return record
    blob = pack_bytes([(k, a.dtype, tuple(a.shape), a.stype, a.data) for k, a in record.items()])
    return ArrayRecord(array_dict={KEY: Array(dtype=DTYPE, shape=(len(blob),), stype=STYPE,
                                              data=blob)})


def unpack_record(record: Any) -> Any:
    """The ArrayRecord :func:`pack_record` packed (``record`` as it is when not packed).
    Raises ``ValueError`` for a packed Array of another :data:`STYPE` version."""
    from flwr.app import Array, ArrayRecord

    if not is_packed(record):
        return record
    packed = record[KEY]
    if packed.stype != STYPE:
        raise ValueError(f"packed arrays of format {packed.stype!r}; this reads {STYPE!r}")
    return ArrayRecord(array_dict={k: Array(dtype=d, shape=s, stype=t, data=b)
                                   for k, d, s, t, b in unpack_bytes(packed.data)})


def _map_arrays(message: Any, fn: Callable[[Any], Any]) -> bool:
    """Apply ``fn`` to every ArrayRecord of ``message``'s content (none: an error reply);
    True when any came back changed (the content then replaced)."""
    from flwr.app import ArrayRecord, RecordDict

    if not message.has_content():
        return False
    items = list(message.content.items())
    new = [(k, fn(r) if isinstance(r, ArrayRecord) else r) for k, r in items]
    if all(a is b for (_, a), (_, b) in zip(items, new)):
        return False
    message.content = RecordDict(dict(new))
    return True


def pack_message(message: Any) -> bool:
    """Pack every ArrayRecord of two or more Arrays in ``message`` (in place); True when
    any was packed."""
    return _map_arrays(message, pack_record)


def unpack_message(message: Any) -> bool:
    """Unpack every packed ArrayRecord of ``message`` (in place); True when any was."""
    return _map_arrays(message, unpack_record)


def client_mod(message: Any, context: Any, call_next: Callable[[Any, Any], Any]) -> Any:
    """The ClientApp's mod (first, outermost): the request unpacked before the client reads
    it, and the reply packed only when the request came packed."""
    packed = unpack_message(message)
    reply = call_next(message, context)
    if packed:
        pack_message(reply)
    return reply


def push_messages(self: Any, messages: Iterable[Any]) -> Any:
    """Flower's ``HttpGrid.push_messages`` of ``messages`` packed (:func:`pack_message`)."""
    messages = list(messages)
    for message in messages:
        pack_message(message)
    return flowers_own("push_messages")(self, messages)


def pull_messages(self: Any, message_ids: Iterable[str]) -> Any:
    """Flower's ``HttpGrid.pull_messages``, each reply unpacked (:func:`unpack_message`)."""
    replies = list(flowers_own("pull_messages")(self, message_ids))
    for reply in replies:
        unpack_message(reply)
    return replies


#: what :func:`install` puts in Flower's place (flower_pfl/tuned/patch.py)
_replaced = Replaced({f"{_GRID}.push_messages": push_messages,
                      f"{_GRID}.pull_messages": pull_messages})
install, installed, uninstall = _replaced.install, _replaced.installed, _replaced.undo
flowers_own = _replaced.flowers  #: Flower's own ``HttpGrid.<name>``, installed or not
