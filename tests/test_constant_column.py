"""pulsartx.log.constant: a one-value column built from buffers equals pyarrow's own repeat."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pulsartx.log.constant import constant


@pytest.mark.parametrize(("value", "type_"), [
    ("DATA", pa.string()), ("stream-query-0123-t3-a1", pa.string()), ("", pa.string()), ("ünïcødé ✓", pa.string()),
    (b"\x00\xffab", pa.binary()), (b"", pa.binary()), (7, pa.int64()), (-3, pa.int32()), (2**40, pa.int64()),
])
@pytest.mark.parametrize("n", [0, 1, 3, 12_500])
def test_constant_equals_repeat(value, type_, n):
    got = constant(value, n, type_)
    got.validate(full=True)
    assert got.type == type_ and len(got) == n and got.null_count == 0
    assert got.equals(pa.repeat(pa.scalar(value, type_), n))


def test_constant_none_is_nulls_and_other_types_repeat():
    assert constant(None, 4, pa.string()).equals(pa.nulls(4, pa.string()))
    ts = pa.timestamp("us", tz="UTC")
    assert constant(5, 3, ts).equals(pa.repeat(pa.scalar(5, ts), 3))


def test_records_carry_their_type_and_producer_in_every_row():
    from pulsartx.log.partition import records_from_arrow
    from pulsartx.log.schema import MessageType

    t = records_from_arrow(pa.array([b"a", b"b", b"c"]), producer_name="p-1", first_sequence_id=5, txn=(1, 2))
    assert t.column("type").to_pylist() == [MessageType.DATA.value] * 3
    assert t.column("producer_name").to_pylist() == ["p-1"] * 3
    assert t.column("sequence_id").to_pylist() == [5, 6, 7]
    assert t.column("txn_most_bits").to_pylist() == [1] * 3 and t.column("txn_least_bits").to_pylist() == [2] * 3


def test_bytes_for_a_string_column_are_refused_as_pyarrow_refuses_them():
    """Invalid UTF-8 must not reach a string column unchecked (pa.repeat raises; so must this)."""
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        constant(b"\xff", 3, pa.string())
    assert constant(b"\xff", 2, pa.binary()).to_pylist() == [b"\xff", b"\xff"]
