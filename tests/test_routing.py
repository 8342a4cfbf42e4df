"""Key routing: Java's String.hashCode and Pulsar's default key-to-partition rule."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsartx.client.routing import RoundRobin, java_string_hash, partition_for_key


def reference_java_hash(s: str) -> int:
    """Java's algorithm written out independently: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code
    units, in 32-bit two's complement."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    h = sum(u * pow(31, n - 1 - i, 2**32) for i, u in enumerate(units)) % 2**32
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize("key,expected", [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("Aa", 2112),
    ("BB", 2112),  # the classic Java collision
    ("polygenelubricants", -(2**31)),  # hashCode() == Integer.MIN_VALUE
    ("\u00e9", 233),
    ("\u65e5\u672c", 26085 * 31 + 26412),  # "日本" = 835047
    ("\U0001F600", 0xD83D * 31 + 0xDE00),  # an emoji is a surrogate pair in UTF-16: 1772899
])
def test_java_string_hash_known_values(key, expected):
    assert java_string_hash(key) == expected
    assert reference_java_hash(key) == expected


def test_java_string_hash_wraps_negative():
    # "hello world".hashCode() in Java.
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("The quick brown fox") == -1739336029


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_java_string_hash_matches_reference(s):
    h = java_string_hash(s)
    assert h == reference_java_hash(s)
    assert -(2**31) <= h < 2**31


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_partition_for_key_matches_pulsar(n):
    # Pulsar: signSafeMod(JavaStringHash.makeHash(key), n), with makeHash = hashCode() & Integer.MAX_VALUE.
    for key in ["", "hello", "polygenelubricants", "The quick brown fox", "\U0001F600", "user-42"]:
        assert partition_for_key(key, n) == (reference_java_hash(key) & 0x7FFFFFFF) % n
    # Integer.MIN_VALUE & MAX_VALUE == 0: always partition 0.
    assert partition_for_key("polygenelubricants", n) == 0


def test_partition_for_key_known_partitions():
    assert [partition_for_key("hello", n) for n in (1, 2, 3, 4, 5)] == [0, 0, 1, 2, 2]
    # hashCode -1739336029 masks to 408147619 (a plain Python modulo of the negative hash would give 2, 3, 1).
    assert [partition_for_key("The quick brown fox", n) for n in (3, 4, 5)] == [1, 3, 4]


@settings(max_examples=300, deadline=None)
@given(key=st.text(max_size=30), n=st.integers(1, 10_000))
def test_partition_for_key_stable_and_in_range(key, n):
    p = partition_for_key(key, n)
    assert 0 <= p < n
    assert partition_for_key(key, n) == p


def test_keys_spread_over_partitions():
    counts = Counter(partition_for_key(f"key-{i}", 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 700


def test_round_robin():
    rr = RoundRobin(3)
    assert [rr.next() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    rr = RoundRobin(3, start=2)
    assert [rr.next() for _ in range(4)] == [2, 0, 1, 2]
    rr = RoundRobin(1)
    assert [rr.next() for _ in range(3)] == [0, 0, 0]
