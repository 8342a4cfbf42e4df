"""Checks on a message's key and properties, made when it is sent rather than when its batch is
written: a bad field found at write time would fail every message batched with it, and the error
would name neither the field nor the fix.

Keys and properties are Arrow/Parquet strings, i.e. UTF-8, as in pulsar-client (``str`` keys,
``dict[str, str]`` properties). Any ``str`` that encodes to UTF-8 round-trips exactly (NUL and
every non-ASCII character included); a ``str`` with lone surrogates (what ``bytes.decode(errors=
"surrogateescape")`` makes of non-UTF-8 bytes) cannot be stored and is refused here.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulsartx.exceptions import InvalidConfiguration

_BINARY_HINT = "keys and properties are UTF-8 strings: encode binary data first (e.g. base64)"


def _check_text(what: str, value: Any, rule: str = "") -> None:
    if not isinstance(value, str):
        raise InvalidConfiguration(f"{rule}{what}={value!r:.80} must be a str, got {type(value).__name__}; "
                                   f"{_BINARY_HINT}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidConfiguration(f"{what}={value!r:.80} is not valid UTF-8 ({e.reason} at position {e.start}); "
                                   f"{_BINARY_HINT}") from None


def check_message_fields(partition_key: Any, properties: Any) -> None:
    """Raise InvalidConfiguration naming the argument when a key or property cannot be stored as sent."""
    if partition_key is not None:
        _check_text("partition_key", partition_key)
    if properties is None:
        return
    rule = "properties must map str to str: "
    if not isinstance(properties, Mapping):
        raise InvalidConfiguration(f"{rule}got a {type(properties).__name__}")
    for k, v in properties.items():
        _check_text("properties key", k, rule)
        _check_text(f"properties[{k!r:.40}]", v, rule)
