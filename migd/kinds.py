"""Fixed word lists (operation kinds, results, policies) as enums written as their words."""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """An enum member that is also its word: JSON, YAML, logs and f-strings show the word
    (``enum.StrEnum`` does this from Python 3.11; migd supports 3.10)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
