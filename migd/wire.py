"""JSON for the documented formats, derived from their frozen dataclasses in one place.

A wire type is a frozen dataclass whose fields are, in order, the document's keys (as mig-parted's
``api/`` types carry their JSON tags): :func:`to_json` writes them in that order, :func:`from_json`
reads a document back into the type and says which field is wrong when it does not fit.  A field
whose metadata has ``OMIT_NONE`` is left out when None (a key some documents carry and others not);
a type's ``SCHEMA`` class attribute is written first as ``schema`` and checked on read.

Why generic: the formats are many and small, and hand-written pairs drift apart; one reader and one
writer keep every format round-tripping, which ``tests/test_wire_docs.py`` checks on every golden file.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")
OMIT_NONE = {"omit_none": True}  # dataclasses.field(metadata=OMIT_NONE)


class WireError(ValueError):
    """A document that does not fit its type: ``where`` is the field's path (``gpus[2].mig.current``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where or 'document'}: {message}")
        self.where = where


def to_json(obj: Any) -> Any:
    """A wire value as JSON-ready data (dicts in field order, enums as their values, tuples as lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        doc: dict[str, Any] = {}
        schema = getattr(type(obj), "SCHEMA", None)
        if schema is not None:
            doc["schema"] = schema
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            doc[f.name] = to_json(value)
        return doc
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    return obj


def from_json(cls: type[T], data: Any, where: str = "") -> T:
    """``data`` read as ``cls`` (a wire dataclass), every field checked against its annotation."""
    value: T = _read(cls, data, where)
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read_record(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise WireError(where, f"expected a mapping, not {type(data).__name__}")
    schema = getattr(cls, "SCHEMA", None)
    if schema is not None and data.get("schema") != schema:
        raise WireError(f"{where}.schema".lstrip("."), f"expected {schema!r}, not {data.get('schema')!r}")
    hints, kwargs = _hints(cls), {}
    for f in dataclasses.fields(cls):
        at = f"{where}.{f.name}".lstrip(".")
        if f.name not in data:
            if f.metadata.get("omit_none") or f.default is not dataclasses.MISSING:
                continue
            raise WireError(at, "missing")
        kwargs[f.name] = _read(hints[f.name], data[f.name], at)
    return cls(**kwargs)


def _read(tp: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        return _read(kinds[0] if len(kinds) == 1 else _pick(kinds, data, where), data, where)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _read_record(tp, data, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise WireError(where, f"{data!r} is not one of {', '.join(str(m.value) for m in tp)}") from None
    if origin in (list, tuple):
        if not isinstance(data, list):
            raise WireError(where, f"expected a list, not {type(data).__name__}")
        item = args[0]
        return tuple(_read(item, v, f"{where}[{i}]") for i, v in enumerate(data))
    if origin is dict:
        if not isinstance(data, dict):
            raise WireError(where, f"expected a mapping, not {type(data).__name__}")
        return {k: _read(args[1], v, f"{where}.{k}") for k, v in data.items()}
    return _scalar(tp, data, where)


def _pick(kinds: list[Any], data: Any, where: str) -> Any:
    for k in kinds:
        if isinstance(k, type) and isinstance(data, k) or k is float and isinstance(data, int):
            return k
    raise WireError(where, f"expected one of {', '.join(getattr(k, '__name__', str(k)) for k in kinds)}, "
                           f"not {type(data).__name__}")


_SCALARS: dict[type, Callable[[Any], bool]] = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),  # JSON writes 1.0 as 1 too
    str: lambda v: isinstance(v, str)}


def _scalar(tp: Any, data: Any, where: str) -> Any:
    ok = _SCALARS.get(tp)
    if ok is None:
        raise TypeError(f"{where}: {tp!r} is not a wire type")  # a programming error, not bad input
    if not ok(data):
        raise WireError(where, f"expected {tp.__name__}, not {data!r}")
    return data
