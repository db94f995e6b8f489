"""JSON for the documented formats and the files migd keeps, derived from their frozen dataclasses in one place.

A wire type is a frozen dataclass whose fields are, in order, the document's keys (as mig-parted's
``api/`` types carry their JSON tags): :func:`to_json` writes them in that order, :func:`from_json`
reads a document back into the type and says which field is wrong when it does not fit.  A field
whose metadata has ``OMIT_NONE`` is left out when None (a key some documents carry and others not);
a field with a default may be absent (fields are only ever added within a schema version); keys the
type does not name are passed over.  A type's ``SCHEMA`` class attribute is written first as
``schema`` and checked on read: ``READS``, when the type has it, lists every schema read as this type
(an older version whose fields all kept their meaning; None: a file written before versions existed).

What JSON cannot say by itself is said by a type too, never by a checker of its own: a choice of words
is an enum; a checked scalar (a UTC time, say) is a :class:`Value`, written as its one field, whose
``__post_init__`` raises ValueError for what does not fit; a mapping keyed by ``int`` is written with
decimal keys (JSON keys are text) and refuses any other; ``tuple[A, B]`` is a list of exactly two.  A
ValueError raised while a dataclass is built from the document is a WireError naming where it was.

Why generic: the formats are many and small, and hand-written pairs drift apart; one reader and one
writer keep every format round-tripping, which ``tests/test_wire_docs.py`` checks on every golden file.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar

from migd.numeral import whole
from migd.printable import clipped

T = TypeVar("T")
OMIT_NONE = {"omit_none": True}  # dataclasses.field(metadata=OMIT_NONE)
MAX_DEPTH = 32  # nesting of the JSON arrays and objects migd reads, from a socket or a state file (its own
# documents nest less than 10 deep; the deepest state file, slurm.json, 8)


def depth(doc: Any) -> int:
    """How deep ``doc``'s arrays and objects nest, MAX_DEPTH + 1 at most (no recursion: the limit is what
    it guards)."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        value, level = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                break
            todo.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


class JsonFault(enum.Enum):
    """Why :func:`loads` refused text: each reader words it in its own message."""

    NOT_JSON = "not JSON"
    TOO_DEEP = "too deep"
    LONG_NUMBER = "a number too long"


class JsonError(ValueError):
    """Text that :func:`loads` does not take: ``fault`` why, ``what`` in words; for text that is not JSON,
    ``line`` and ``column`` where (None when json names no place), and json's ``reason``."""

    def __init__(self, fault: JsonFault, what: str, line: int | None = None, column: int | None = None,
                 reason: str = "") -> None:
        super().__init__(what)
        self.fault, self.what, self.line, self.column, self.reason = fault, what, line, column, reason


def loads(text: str | bytes) -> Any:
    """JSON as migd reads it from a socket line or a state file, nested at most MAX_DEPTH deep: json's
    own recursion (text nested 100,000 deep) and Python's limit on an integer's digits raise, not a
    JSONDecodeError, and either was a traceback."""
    try:  # (bytes decoded as UTF-8 here: json.loads guesses UTF-16 or 32 from a leading NUL, and says so)
        doc = json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except json.JSONDecodeError as e:
        raise JsonError(JsonFault.NOT_JSON, f"not JSON ({e})", e.lineno, e.colno, e.msg) from None
    except RecursionError:
        raise JsonError(JsonFault.TOO_DEEP, f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        why = f"not UTF-8: {e.reason} at byte {e.start}"
        raise JsonError(JsonFault.NOT_JSON, f"not JSON ({why})", reason=why) from None
    except ValueError:  # (the only other: an integer of too many digits to convert)
        raise JsonError(JsonFault.LONG_NUMBER, f"a number of more than {sys.get_int_max_str_digits()} digits") from None
    if depth(doc) > MAX_DEPTH:
        raise JsonError(JsonFault.TOO_DEEP, f"nested deeper than {MAX_DEPTH} levels")
    return doc


class WireError(ValueError):
    """A document that does not fit its type: ``where`` is the field's path (``gpus[2].mig.current``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where, self.message = where, message


class Value:
    """A checked scalar: subclassed by a frozen dataclass of one field, which is all the document holds
    (a UTC time is its text); the subclass's ``__post_init__`` raises ValueError for a value that does not
    fit, and :func:`from_json` names the field."""


def to_json(obj: Any) -> Any:
    """A wire value as JSON-ready data (dicts in field order, enums as their values, tuples as lists)."""
    if isinstance(obj, Value):
        return to_json(getattr(obj, dataclasses.fields(obj)[0].name))  # type: ignore[arg-type]
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


def _build(cls: type, where: str, *args: Any, **kwargs: Any) -> Any:
    """``cls`` made; its own check's ValueError said at ``where`` (at the top, the check's words name it)."""
    try:
        return cls(*args, **kwargs)
    except WireError:
        raise
    except ValueError as e:
        raise WireError(where, str(e)) from None


def _read_record(cls: type, data: Any, where: str) -> Any:
    schema = getattr(cls, "SCHEMA", None)
    if not isinstance(data, dict):
        if schema is not None:
            raise WireError(_join(where, "schema"), f"expected a {schema} mapping, not {type(data).__name__}")
        raise WireError(where or "document", f"expected a mapping, not {type(data).__name__}")
    reads = getattr(cls, "READS", (schema,))
    if schema is not None and data.get("schema") not in reads:
        said = " or ".join(repr(s) for s in reads if s is not None)
        raise WireError(_join(where, "schema"), f"expected {said}, not {data.get('schema')!r}")
    hints, kwargs = _hints(cls), {}
    for f in dataclasses.fields(cls):
        at = _join(where, f.name)
        if f.name not in data:
            if f.metadata.get("omit_none") or f.default is not dataclasses.MISSING or \
                    f.default_factory is not dataclasses.MISSING:
                continue
            raise WireError(at, "missing")
        kwargs[f.name] = _read(hints[f.name], data[f.name], at)
    return _build(cls, where, **kwargs)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _read(tp: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        return _read(kinds[0] if len(kinds) == 1 else _pick(kinds, data, where), data, where)
    if origin in (list, tuple):
        return _sequence(origin, args, data, where)
    if origin is dict:
        if not isinstance(data, dict):
            raise WireError(where or "document", f"expected a mapping, not {type(data).__name__}")
        return {_key(args[0], k, _join(where, _short(k))): _read(args[1], v, _join(where, _short(k)))
                for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, Value):
        (f,) = dataclasses.fields(tp)  # type: ignore[arg-type]
        return _build(tp, where, _read(_hints(typing.cast(type, tp))[f.name], data, where))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _read_record(tp, data, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            raise WireError(where, f"{data!r} is not one of {', '.join(str(m.value) for m in tp)}") from None
    return _scalar(tp, data, where)


def _sequence(origin: Any, args: tuple[Any, ...], data: Any, where: str) -> tuple[Any, ...]:
    """A list as a tuple: of one type (``tuple[int, ...]``, ``list[int]``) or, ``tuple[A, B]``, of these."""
    if not isinstance(data, list):
        raise WireError(where, f"expected a list, not {type(data).__name__}")
    if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
        if len(data) != len(args):
            raise WireError(where, f"expected {len(args)} items, not {len(data)}")
        return tuple(_read(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
    return tuple(_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))


def _key(tp: Any, key: str, where: str) -> Any:
    """A mapping's key: text, or an ``int`` written in decimal digits (what :func:`to_json` writes)."""
    if tp is int:
        number = whole(key)
        if number is not None:
            return number
        if key.isascii() and key.isdigit():  # more digits than migd reads (int refuses 4,300 and more)
            raise WireError(where, f"key of {len(key)} digits is not a number migd reads")
        raise WireError(where, f"key {_short(key)!r} is not a number")
    return _read(tp, key, where)


def _short(key: str) -> str:
    """A key as an error's field path shows it: its start, when long (a hand-edited key of 5,000 digits
    would otherwise be the whole line)."""
    return clipped(key)


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
