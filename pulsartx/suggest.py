"""A misspelt option or keyword fails, naming the nearest valid one.

Used by the Spark options (:mod:`pulsartx.datasource.option_table`) and by the client's keyword arguments:
Python's own ``TypeError: got an unexpected keyword argument`` names the keyword but not what was
meant, and ``Client``, ``create_producer``, ``subscribe`` and ``create_reader`` used to swallow
unknown keywords (pulsar-client's style) so a typo silently kept a default.
"""
from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

from pulsartx.exceptions import UnknownOption

F = TypeVar("F", bound=Callable[..., Any])


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` (ignoring case), if any is close enough to be a typo."""
    by_lower = {c.lower(): c for c in candidates}
    found = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def keyword_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The parameters of ``fn`` that can be passed by keyword, with their defaults
    (``inspect.Parameter.empty`` where there is none)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind in kinds and p.name not in ("self", "cls")}


def refuse_unknown(where: str, given: Mapping[str, Any], accepted: Collection[str]) -> None:
    """Raise for the first keyword in ``given`` not in ``accepted``, as Python words it, plus the
    nearest accepted keyword."""
    for name in given:
        if name in accepted:
            continue
        guess = nearest(name, accepted)
        hint = f"did you mean {guess!r}?" if guess else f"its keywords are {', '.join(sorted(accepted))}"
        raise UnknownOption(f"{where}() got an unexpected keyword argument {name!r}: {hint}")


def checked_keywords(*forwarded_to: Callable[..., Any]) -> Callable[[F], F]:
    """Decorator: keywords the function does not name, nor the functions it forwards ``**kwargs``
    to, are refused before the body runs (so a typo never auto-creates a topic, say)."""

    def decorate(fn: F) -> F:
        keywords: dict[str, Any] = {}
        for f in (*reversed(forwarded_to), fn):  # the function's own defaults win
            keywords.update(keyword_defaults(f))
        accepted = frozenset(keywords)
        where = fn.__qualname__.replace(".__init__", "")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs and not accepted.issuperset(kwargs):
                refuse_unknown(where, kwargs, accepted)
            return fn(*args, **kwargs)

        wrapper.keywords = keywords  # type: ignore[attr-defined]  # what the docstring must list
        return wrapper  # type: ignore[return-value]

    return decorate
