"""Records of one topic as numpy columns, decoded a poll at a time.

A stream consumer that computes on many records (the risk service's feature engines) wants
columns, not objects: one array per field, one element per record. Building them costs a Python
step per value, which is as much as decoding the message costs, so it is done once per poll and
only for the fields the consumer names (:func:`record_columns`).

:class:`ColumnDecoder` decodes a topic's messages into records that hold NaN, not None, for a
numeric field the message leaves out: then a record's numbers go into a float column without a
test per value. The record type is derived from the contract's (the same fields, types and
bounds; only those defaults differ), so a message is accepted or refused, with the same reason,
exactly as :func:`foreshock.ingest.contract.decode` would.

Column types: ``ts`` and the other required integers are ``int64``; optional numbers (and
integers with a default) are ``float64`` with NaN where absent; strings and anything else are
``object`` arrays (None where absent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from itertools import chain
from operator import attrgetter
from typing import Any, Final

import msgspec
import msgspec.inspect as mi
import numpy as np

from foreshock.ingest.contract import RECORD_TYPES, decode

__all__ = ["ColumnDecoder", "record_columns", "column_kinds"]

_NUMBERS: Final = (mi.IntType, mi.FloatType)


def column_kinds(topic: str) -> dict[str, str]:
    """Each field of ``topic``'s records: ``int`` (a required integer), ``float`` (any other number,
    NaN when absent) or ``object``."""
    return dict(_kinds(topic))


@cache
def _kinds(topic: str) -> tuple[tuple[str, str], ...]:
    out = []
    for f in mi.type_info(RECORD_TYPES[topic]).fields:
        t = f.type
        if isinstance(t, mi.IntType) and f.required:
            kind = "int"
        elif isinstance(t, _NUMBERS) or (isinstance(t, mi.UnionType) and len(t.types) == 2
                                         and any(isinstance(u, mi.NoneType) for u in t.types)
                                         and any(isinstance(u, _NUMBERS) for u in t.types)):
            kind = "float"
        else:
            kind = "object"
        out.append((f.name, kind))
    return tuple(out)


def record_columns(topic: str, records: Sequence[Any], fields: Sequence[str]) -> dict[str, np.ndarray]:
    """``fields`` of ``records`` (of ``topic``, in order) as columns; see the module docstring for
    their types. Records of the contract's types and of :class:`ColumnDecoder`'s both work."""
    kinds = column_kinds(topic)
    n = len(records)
    out: dict[str, np.ndarray] = {}
    floats = [f for f in fields if kinds[f] == "float"]
    if floats:  # one pass over every value: a None (a contract record) reads as NaN
        values = chain.from_iterable(map(attrgetter(*floats), records)) if len(floats) > 1 else \
            map(attrgetter(floats[0]), records)
        block = np.fromiter(values, np.float64, n * len(floats)).reshape(n, len(floats)).T
        out.update(zip(floats, block, strict=True))
    for f in fields:
        if kinds[f] == "int":
            out[f] = np.fromiter(map(attrgetter(f), records), np.int64, n)
        elif kinds[f] == "object":
            column = np.empty(n, dtype=object)
            column[:] = list(map(attrgetter(f), records))
            out[f] = column
    return {f: out[f] for f in fields}


class ColumnDecoder:
    """Decodes messages of ``topic`` (see the module docstring) and turns records into columns."""

    def __init__(self, topic: str):
        self.topic = topic
        self._decoder = _decoder(topic)

    def decode(self, data: bytes | None) -> list[Any]:
        """Like :func:`foreshock.ingest.contract.decode` (the same records accepted, the same
        :class:`~foreshock.ingest.contract.RecordError` otherwise), NaN for absent numbers."""
        return decode(self.topic, data, decoder=self._decoder)


@cache
def _decoder(topic: str) -> msgspec.json.Decoder:
    base = RECORD_TYPES[topic]
    kinds = column_kinds(topic)
    spec: list[Any] = []
    for f in msgspec.structs.fields(base):
        if f.default is None and kinds[f.name] == "float":
            spec.append((f.name, f.type, math.nan))
        elif f.default is not msgspec.NODEFAULT:
            spec.append((f.name, f.type, f.default))
        elif f.default_factory is not msgspec.NODEFAULT:
            spec.append((f.name, f.type, msgspec.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, f.type))
    columnar = msgspec.defstruct(base.__name__, spec, kw_only=True, frozen=True, gc=False)
    return msgspec.json.Decoder(columnar | list[columnar])  # type: ignore[operator]
