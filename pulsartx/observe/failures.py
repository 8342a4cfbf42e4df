"""Failures that repeat at every pass or scrape (a damaged log, a store down): each is worth one
WARNING when it starts or changes, then DEBUG while it lasts, not a WARNING per pass. Shared by the
coordinator service and the metrics collector."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def unreadable_row(keys: Iterable[str], error: str, **known: Any) -> dict[str, Any]:
    """A view's row for one thing (a TC, a partition) that cannot be read: the fields of the
    others, empty but for ``known`` (what names it), and its ``error``. One damaged table must not
    hide the others from the views an operator needs then, and with the same fields the table
    and JSON still line up."""
    return {**dict.fromkeys(keys), **known, "error": error}


def one_line(e: BaseException) -> str:
    """``e``'s text on one line: a view's row, a table cell or a repeated log line holds one line
    per failure."""
    return " ".join(str(e).split())


class RepeatedFailures:
    """The error each failing thing (a TC, a topic, a partition, a pass) was last reported with."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def is_news(self, what: str, error: str) -> bool:
        """Record ``error`` as ``what``'s; True when ``what`` last failed otherwise, or not at all
        since it last worked (worth a WARNING)."""
        new = self._last.get(what) != error
        self._last[what] = error
        return new

    def cleared(self, what: str) -> None:
        """``what`` worked: its next failure is news again, even with the same error."""
        self._last.pop(what, None)
