"""Bad input, as every layer reports it: one type, at the bottom of the import graph.

Parsing (``yamlsrc``), trust checks (``trust``), state files, profiles and the daemon's requests all
raise it; ``migd.exits`` maps it to exit 2.  Nothing has been changed on any GPU when it is raised.
Its line is printable (``migd.printable``) wherever it is printed; ``to_json`` keeps the exact values.
"""

from __future__ import annotations

from collections.abc import Iterable

from migd.printable import shown


class ValidationError(Exception):
    """Bad input.  Nothing has been changed on any GPU when this is raised."""

    def __init__(self, file: str, line: int | None, column: int | None, field: str, message: str,
                 allowed: Iterable[str] | None = None) -> None:
        self.file, self.line, self.column, self.field = file, line, column, field
        self.message = message
        self.allowed = list(allowed) if allowed is not None else None
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.column}"
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        if self.allowed:
            text += f" (allowed: {', '.join(self.allowed)})"
        return shown(text)  # (the file's name or a value quoted may hold an ESC: the line may reach a terminal)

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "column": self.column, "field": self.field,
                "message": self.message, "allowed": self.allowed}
