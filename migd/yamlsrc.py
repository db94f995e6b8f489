"""YAML with locations: every value keeps its file, line and column for error messages.

PyYAML's composer already records marks on every node; this module walks nodes instead
of plain dicts so a validation error can say ``day.yaml:7:9: gpus[0].instances[1].count:
must be a positive integer`` and list the allowed values.
"""

from __future__ import annotations

import builtins
import ipaddress
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import yaml

from migd.errors import ValidationError
from migd.numeral import whole
from migd.printable import clipped, code, unprintable
from migd.trust import open_regular, refuse_untrusted

_TOKEN = re.compile(r"[A-Za-z0-9+=_-]{20,}")  # a long unbroken run: a key, a token, a password hash
_HEXISH = re.compile(r"^(?:(?:GPU|MIG)-)?[0-9a-fA-F-]+$")  # a (GPU or MIG) UUID, a PCI id: shown
_HIDDEN = ("PRIVATE KEY", "BEGIN ", "$1$", "$2", "$5$", "$6$", "$y$")
_BOOLS = {**yaml.SafeLoader.bool_values, "y": True, "n": False}  # YAML 1.1's words (PyYAML's, and y/n as
# an explicit ``!!bool`` takes them, as migd read them before and Go's yaml.v2 reads them)
MAX_INT_CHARS = 40  # no count, index or id a configuration gives is longer, in any base YAML 1.1 writes


def _secret_looking(text: str) -> bool:
    if any(h in text for h in _HIDDEN):
        return True
    for run in _TOKEN.findall(text):
        mixed = any(c.isdigit() for c in run) or (any(c.isupper() for c in run) and any(c.islower() for c in run))
        if mixed and not _HEXISH.match(run):
            return True
    return False


def excerpt(text: object, limit: int = 40) -> str:
    """How a value read from a user's file is quoted in a message, in one place: short, on one line, and
    not at all where it looks like a secret (migctl may be handed a private key or a shadow file by
    mistake; root can read it, and the message may reach a terminal, a log or a ticket)."""
    flat = " ".join(str(text).split())
    if _secret_looking(flat):
        return f"a value of {len(flat)} characters (not shown: it looks like a key, token or password hash)"
    return repr(clipped(flat, limit - 3))


@dataclass(frozen=True)
class Node:
    """A YAML node with the path of keys that led to it."""

    file: str
    field: str
    node: yaml.Node

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    @property
    def column(self) -> int:
        return int(self.node.start_mark.column) + 1

    def error(self, message: str, allowed: Iterable[str] | None = None) -> ValidationError:
        return ValidationError(self.file, self.line, self.column, self.field, message, allowed)

    def _child(self, key: str | int, node: yaml.Node) -> Node:
        if isinstance(key, int):
            return Node(self.file, f"{self.field}[{key}]", node)
        return Node(self.file, f"{self.field}.{key}" if self.field else key, node)

    # -- shapes -----------------------------------------------------------------------------------
    def is_scalar(self) -> bool:
        return isinstance(self.node, yaml.ScalarNode)

    def is_mapping(self) -> bool:
        return isinstance(self.node, yaml.MappingNode)

    def is_sequence(self) -> bool:
        return isinstance(self.node, yaml.SequenceNode)

    def is_bool(self) -> bool:
        """A YAML boolean (``true``, ``no``, ...): for a key that takes one or a word (``mixes: auto``)."""
        return self.is_scalar() and str(self.node.tag) == "tag:yaml.org,2002:bool"

    def mapping(self, allowed: Iterable[str] | None = None, required: Iterable[str] = ()) -> dict[str, Node]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"must be a mapping, not {self._kind()}")
        allowed_list = list(allowed) if allowed is not None else None
        out: dict[str, Node] = {}
        for k, v in self.node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if not isinstance(key, str):
                raise Node(self.file, self.field, k).error("keys must be strings")
            if key in out:
                raise Node(self.file, self.field, k).error(f"duplicate key {excerpt(key)}")
            if allowed_list is not None and key not in allowed_list:
                shown = key if excerpt(key) == repr(key) else "?"
                raise self._child(shown, k).error(f"unknown key {excerpt(key)}", allowed_list)
            out[key] = self._child(key, v)
        for key in required:
            if key not in out:
                raise self.error(f"missing required key {key!r}")
        return out

    def named(self, allowed: Iterable[str] | None = None, required: Iterable[str] = ()) -> dict[str, Node]:
        """A mapping whose keys are names (mig-parted's configs, access owners): each key as :meth:`name`
        checks a value, refused on its own line."""
        out = self.mapping(allowed, required)
        for k, _ in self.node.value:
            Node(self.file, self.field, k).printable(str(k.value))
        return out

    def items(self) -> Iterator[Node]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"must be a list, not {self._kind()}")
        for i, v in enumerate(self.node.value):
            yield self._child(i, v)

    def _kind(self) -> str:
        if isinstance(self.node, yaml.MappingNode):
            return "a mapping"
        if isinstance(self.node, yaml.SequenceNode):
            return "a list"
        return excerpt(self.node.value) if self.node.value != "" else "empty"

    # -- scalars ----------------------------------------------------------------------------------
    def name(self, choices: Iterable[str] | None = None) -> str:
        """A name the operator gives (a profile, an owner, a group, a Slurm node): tables, logs and the page
        print it as it is, so it may hold no unprintable character (``migd.printable``)."""
        value = self.str(choices)
        self.printable(value)
        return value

    def printable(self, text: str) -> None:
        """Refuse a name holding an unprintable character (an ESC, a BEL, a newline, a bidi override)."""
        char = unprintable(text)
        if char is not None:
            raise self.error(f"{excerpt(text)} holds {code(char)}, an unprintable character: a name is printed to "
                             "terminals and logs as it is, so it may hold none")

    def _scalar(self) -> tuple[str, str]:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error(f"must be a single value, not {self._kind()}")
        return str(self.node.tag), str(self.node.value)

    def str(self, choices: Iterable[str] | None = None) -> str:
        """A text value.  None holds NUL: every one is a name, a path, an argument or a time, and the
        kernel's paths, exec and chdir take C strings (a path holding one raised ValueError at start)."""
        tag, value = self._scalar()
        if tag == "tag:yaml.org,2002:null" or (tag != "tag:yaml.org,2002:str" and value == ""):
            raise self.error("must not be empty")
        if "\0" in value:
            raise self.error("holds a NUL byte, which no name, program argument, path or environment value can")
        choice_list = list(choices) if choices is not None else None
        if choice_list is not None and value not in choice_list:
            raise self.error(f"{excerpt(value)} is not allowed", choice_list)
        return value

    def int(self, minimum: int | None = None, maximum: int | None = None) -> int:
        tag, value = self._scalar()
        if tag != "tag:yaml.org,2002:int":
            raise self.error(f"must be an integer, not {excerpt(value)}")
        if len(value) > MAX_INT_CHARS:  # (Python turns no int of 4,300 digits or more into text: the
            raise self.error(f"{excerpt(value)} is not an integer migd reads (at most {MAX_INT_CHARS} "  # error
                             "characters)")  # below would have raised ValueError, a traceback)
        try:  # YAML 1.1 ints include 0x1F, 0o17, 1_000 and 1:30 (sexagesimal): let PyYAML read them
            n = int(yaml.SafeLoader("").construct_yaml_int(cast(yaml.ScalarNode, self.node)))  # _scalar checked
        except (ValueError, IndexError, yaml.YAMLError):  # (IndexError: PyYAML's reading of ``!!int ""``)
            raise self.error(f"{excerpt(value)} is not an integer") from None
        if minimum is not None and n < minimum:
            raise self.error(f"must be at least {minimum}, not {n}")
        if maximum is not None and n > maximum:
            raise self.error(f"must be at most {maximum}, not {n}")
        return n

    def bool(self) -> bool:
        tag, value = self._scalar()
        word = _BOOLS.get(value.lower()) if tag == "tag:yaml.org,2002:bool" else None
        if word is None:  # (an explicit ``!!bool maybe`` is tagged bool and is no boolean: it was read as false)
            raise self.error(f"must be true or false, not {excerpt(value)}")
        return word

    def arg(self) -> builtins.str:
        """A string handed to a program (an argument, a path, an environment value): :meth:`str`, which
        refuses NUL (one crashed the first apply)."""
        return self.str()

    def environment(self) -> tuple[tuple[builtins.str, builtins.str], ...]:
        """``{NAME: value}`` for a program's environment: a name is not empty and holds neither ``=``
        nor NUL (the kernel's ``NAME=value`` strings), a value no NUL."""
        out = []
        for name, value in self.mapping().items():
            if not name or "=" in name or "\0" in name:
                raise value.error(f"{excerpt(name)} is not an environment variable name (empty, or holds = or NUL)")
            out.append((name, value.arg()))
        return tuple(out)

    def duration(self) -> float:
        """Seconds from ``90``, ``30s``, ``5m``, ``1h``, ``1h30m``."""
        _, value = self._scalar()
        return parse_duration(value, self)


_DURATION = re.compile(r"^(?:([0-9]{1,12})h)?(?:([0-9]{1,12})m)?(?:([0-9]{1,12}(?:\.[0-9]{1,9})?)s?)?$", re.ASCII)
MAX_DURATION_S = 366 * 24 * 3600.0  # a year: no interval, timeout or window migd takes is longer, and a
# time that far past now still fits every clock and timer it is added to (time_t, threading's timeouts)
SECONDS_RANGE = f"seconds from 0 to {MAX_DURATION_S:.0f} (a year)"


def within_a_year(seconds: float) -> bool:
    """The range of every duration migd takes, from a file, an option or its socket (NaN is not in it)."""
    return 0 <= seconds <= MAX_DURATION_S


def parse_duration(value: str, where: Node | None = None) -> float:
    """Seconds; ``where``: the YAML node it came from, named in the error."""
    m = _DURATION.fullmatch(value.strip())
    msg = None
    if not value.strip() or not m or not any(m.groups()):
        msg = f"{excerpt(value)} is not a duration (examples: 90, 30s, 5m, 1h30m)"
    else:
        h, mi, s = m.groups()
        seconds = int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)
        if within_a_year(seconds):
            return seconds
        msg = f"{excerpt(value)} is longer than a year (at most {MAX_DURATION_S / 3600:g}h)"
    if where is not None:
        raise where.error(msg)
    raise ValueError(msg)


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9835`` for IPv6) as the metrics listener takes it; ValueError otherwise."""
    host, _, port = value.rpartition(":")
    number = whole(port, 5)
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if number is None or number > 65535 or not host:
        raise ValueError(f"{excerpt(value)} is not HOST:PORT (e.g. 127.0.0.1:9835, [::1]:9835, node1.lab:9835)")
    if name == host and ":" in name:  # '::1:9835' is also the address ::1:9835 with no port
        raise ValueError(f"{excerpt(value)}: a host with ':' is an IPv6 address, in brackets: [::1]:9835")
    if not (name == "*" == host or _is_host(name)) or (name != host and ":" not in name):
        raise ValueError(f"{excerpt(value)}: the host is not an IP address, a host name (letters, digits, '-', "
                         "'_', '.'; labels of 1 to 63) or * (every interface)")
    return name, number


_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$", re.ASCII)


def _is_host(name: str) -> bool:
    """An IP address, or a DNS name of ASCII labels (``_`` too: /etc/hosts has them): what the listener binds.
    A label over 63 characters, an empty one (``a..b``) or a non-ASCII name passed here and then stopped
    migd at start with a UnicodeError traceback from the IDNA codec."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    labels = name[:-1].split(".") if name.endswith(".") else name.split(".")
    return 0 < len(name) <= 253 and all(_LABEL.match(label) for label in labels)


def read(path: str | Path, strict: bool = False, what: str = "file", pipes: bool = False) -> str:
    """A file's text; ``strict`` refuses it unless trusted (``migd.trust``), checked on the opened file.
    Only a regular file: a FIFO or a device (``/dev/zero``) named as a profile, or left in the profiles
    directory, would block the reader or never end, so it is refused before a byte is read.  At most
    ``MAX_BYTES`` are read: a file of gigabytes named by mistake is refused, not read into memory."""
    try:
        fd, st = open_regular(path, lead="cannot read file: it ", pipes=pipes)  # (pipes: trust.open_regular)
        with open(fd, "rb", closefd=True) as f:
            if strict:
                refuse_untrusted(str(path), st, what)
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ValidationError(str(path), None, None, "", f"cannot read file: {e}") from e
    return _text(str(path), data)


def read_stream(name: str, stream: BinaryIO) -> str:
    """Standard input's text (``migctl plan -``), as :func:`read` gives a file's: UTF-8 and at most
    ``MAX_BYTES`` (an endless pipe is cut there and refused, not read until memory runs out)."""
    return _text(name, stream.read(MAX_BYTES + 1))


def _text(name: str, data: bytes) -> str:
    if len(data) > MAX_BYTES:
        raise _too_large(name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(name, None, None, "", f"cannot read file: not UTF-8 text ({e.reason} at byte "
                              f"{e.start})") from e


def _too_large(name: str) -> ValidationError:
    """The one message for a profile or config past ``MAX_BYTES``, read from a file, a pipe or a socket."""
    return ValidationError(name, None, None, "", f"more than {MAX_BYTES} bytes; a profile or config is at most "
                           f"{MAX_BYTES} (NVIDIA's whole config-default.yaml is 12 KB)")


# libyaml's parser when PyYAML was built with it (5-7x faster on a large file; same nodes and marks)
LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_BYTES = 128 * 1024
MAX_DEPTH = 32  # a profile is 6 levels deep; PyYAML's composer recurses per level
MAX_NODES = 20_000  # values, with aliases expanded (no "billion laughs")
_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _at(ev: yaml.Event) -> tuple[int | None, int | None]:
    m = ev.start_mark
    return (m.line + 1, m.column + 1) if m is not None else (None, None)


def _check_shape(name: str, text: str) -> None:
    """Refuse, from the event stream (no recursion), YAML too deep or too large once aliases expand."""
    depth = count = 0
    open_: list[tuple[str | None, int]] = []  # per open collection: its anchor, the count at its start
    sizes: dict[str, int] = {}
    for ev in yaml.parse(text, Loader=LOADER):
        if isinstance(ev, _OPEN):
            depth, count = depth + 1, count + 1
            if depth > MAX_DEPTH:
                raise ValidationError(name, *_at(ev), "", f"nested deeper than {MAX_DEPTH} levels")
            open_.append((ev.anchor, count))
        elif isinstance(ev, _CLOSE):
            depth -= 1
            anchor, start = open_.pop()
            if anchor:
                sizes[anchor] = count - start + 1
        elif isinstance(ev, yaml.ScalarEvent):
            count += 1
            if ev.anchor:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.AliasEvent):
            count += sizes.get(ev.anchor or "", 1)
        if count > MAX_NODES:
            raise ValidationError(name, *_at(ev), "", f"more than {MAX_NODES} values (aliases expanded): not a "
                                  "profile")


def load(path: str | Path, text: str | None = None, strict: bool = False, what: str = "file") -> Node:
    """Parse one YAML document, keeping marks.  Syntax errors become ValidationError.

    ``strict`` refuses a file that group or others may write (StrictModes), checked on the
    opened file itself so it cannot be swapped between the check and the read.
    """
    name = str(path)
    if text is None:
        text = read(path, strict, what)  # (read no more than MAX_BYTES)
    elif len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise _too_large(name)
    try:
        _check_shape(name, text)
        node = yaml.compose(text, Loader=LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        raise ValidationError(name, line, col, "", f"invalid YAML: {e.problem}") from e
    except yaml.reader.ReaderError as e:  # bad characters: a character offset, not a mark
        pos = int(e.position)
        line, col = text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)
        raise ValidationError(name, line, col, "", f"invalid YAML: {e.reason} (character {e.character!r})") from e
    except yaml.YAMLError as e:
        raise ValidationError(name, 1, 1, "", f"invalid YAML: {e}") from e
    if node is None:
        raise ValidationError(name, 1, 1, "", "file is empty")
    return Node(name, "", node)
