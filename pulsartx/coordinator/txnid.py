"""TxnID: 128 bits, the TC id in the most significant half and the TC's counter in the other,
as in PIP-31 (``CommandNewTxnResponse``)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from pulsartx.exceptions import InvalidConfiguration

_TEXT = re.compile(r"^\(?\s*(-?\d+)\s*[,:]\s*(-?\d+)\s*\)?$")


@dataclass(frozen=True, order=True)
class TxnID:
    most_bits: int
    least_bits: int

    @property
    def tc_id(self) -> int:
        return self.most_bits

    def __str__(self) -> str:
        return f"({self.most_bits},{self.least_bits})"

    def as_tuple(self) -> tuple[int, int]:
        return (self.most_bits, self.least_bits)

    @classmethod
    def parse(cls, value: str | TxnID | tuple[int, int]) -> TxnID:
        """Accepts a TxnID, a (most, least) tuple, or the text "most,least", "most:least" or
        "(most,least)" (the first two need no shell quoting)."""
        if isinstance(value, TxnID):
            return value
        if isinstance(value, tuple) and len(value) == 2:
            return cls(int(value[0]), int(value[1]))
        m = _TEXT.match(str(value))
        if not m:
            raise InvalidConfiguration(f"transaction id {value!r} is not of the form 'most,least', 'most:least' or "
                                       "'(most,least)', e.g. 15:0")
        return cls(int(m.group(1)), int(m.group(2)))
