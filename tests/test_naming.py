"""Topic naming: the accepted forms, partition addressing, and the rules that keep names inside the root."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulsartx.exceptions import InvalidTopicName
from pulsartx.naming import MAX_NAME_LENGTH, MAX_SEGMENT_LENGTH, TopicName, parse_namespace
from pulsartx.storage.root import StorageRoot

# ---- accepted forms -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["persistent://public/default/orders", "public/default/orders", "orders"])
def test_three_forms_name_the_same_topic(name):
    t = TopicName.parse(name)
    assert t == TopicName("public", "default", "orders", None)
    assert str(t) == "persistent://public/default/orders"
    assert t.short == "public/default/orders"
    assert t.namespace_name == "public/default"
    assert t.path_segments() == ("public", "default", "orders")


def test_explicit_tenant_and_namespace():
    t = TopicName.parse("persistent://acme-corp/billing.eu/invoices_v2=x:y")
    assert (t.tenant, t.namespace, t.local_name, t.partition) == ("acme-corp", "billing.eu", "invoices_v2=x:y", None)
    assert TopicName.parse(str(t)) == t


def test_non_persistent_domain_is_accepted_and_normalised():
    assert str(TopicName.parse("non-persistent://a/b/c")) == "persistent://a/b/c"


@pytest.mark.parametrize("name,expected", [
    ("orders-partition-0", TopicName("public", "default", "orders", 0)),
    ("orders-partition-17", TopicName("public", "default", "orders", 17)),
    ("t/n/orders-partition-3", TopicName("t", "n", "orders", 3)),
    ("persistent://t/n/orders-partition-3", TopicName("t", "n", "orders", 3)),
    # Only the last suffix addresses a partition.
    ("a-partition-1-partition-2", TopicName("public", "default", "a-partition-1", 2)),
    # Not a partition suffix: no digits, or no base name.
    ("orders-partition-", TopicName("public", "default", "orders-partition-", None)),
    ("orders-partition-x", TopicName("public", "default", "orders-partition-x", None)),
    ("-partition-3", TopicName("public", "default", "-partition-3", None)),
])
def test_partition_addressing(name, expected):
    assert TopicName.parse(name) == expected


def test_partition_helpers_round_trip():
    t = TopicName.parse("t/n/orders-partition-3")
    assert str(t) == "persistent://t/n/orders-partition-3"
    assert t.short == "t/n/orders-partition-3"
    assert t.base == TopicName("t", "n", "orders", None)
    assert t.base.with_partition(3) == t
    assert TopicName.parse(str(t)) == t
    # The partition lives under the topic's folder, not in a folder of its own name.
    assert t.path_segments() == ("t", "n", "orders")


def test_parse_namespace():
    assert parse_namespace("public/default") == ("public", "default")
    with pytest.raises(InvalidTopicName, match="must be 'tenant/namespace'"):
        parse_namespace("public")
    with pytest.raises(InvalidTopicName, match="must be 'tenant/namespace'"):
        parse_namespace("a/b/c")
    with pytest.raises(InvalidTopicName, match=r"rule: no '\.\.' in a name"):
        parse_namespace("a/..")


# ---- rejections ---------------------------------------------------------------------------------

REJECTIONS = [
    # (name, substring of the message naming the rule)
    ("", "rule: no empty name"),
    ("t//orders", "the namespace is empty (rule: no empty name or segment)"),
    ("/n/orders", "the tenant is empty (rule: no empty name or segment)"),
    ("t/n/", "the topic is empty (rule: no empty name or segment)"),
    ("a..b", "rule: no '..' in a name"),
    ("..", "rule: no '..' in a name"),
    ("t/../orders", "rule: no '..' in a name"),
    ("persistent://../n/orders", "rule: no '..' in a name"),
    ("a/b", "contains a path separator where none belongs"),
    ("a/b/c/d", "contains a path separator where none belongs"),
    ("persistent://a/b", "contains a path separator where none belongs"),
    ("persistent:///a/b/c", "contains a path separator where none belongs"),
    ("a\\b", "contains a path separator (rule: '/' only separates tenant/namespace/topic)"),
    ("t/n/..\\..\\etc", "rule: no '..' in a name"),
    ("t/n/x\\etc", "rule: '/' only separates tenant/namespace/topic"),
    ("a\x00b", "rule: no control characters"),
    ("a\nb", "rule: no control characters"),
    ("t/n/a\x1fb", "rule: no control characters"),
    ("del\x7f", "rule: no control characters"),
    ("x" * (MAX_NAME_LENGTH + 1), f"is {MAX_NAME_LENGTH + 1} characters long (rule: at most {MAX_NAME_LENGTH})"),
    ("x" * (MAX_SEGMENT_LENGTH + 1), f"is {MAX_SEGMENT_LENGTH + 1} characters long (rule: at most {MAX_SEGMENT_LENGTH})"),
    ("_delta_log", "rule: reserved for storage"),
    ("_pulsartx", "rule: reserved for storage"),
    (".hidden", "rule: reserved for storage"),
    ("t/n/.", "rule: reserved for storage"),
    ("a b", "rule: only letters, digits and _ - = : ."),
    ("caf\u00e9", "rule: only letters, digits and _ - = : ."),
    ("a*b", "rule: only letters, digits and _ - = : ."),
    ("http://a/b/c", "unknown domain 'http' (rule: use persistent://)"),
]


@pytest.mark.parametrize("name,rule", REJECTIONS, ids=[repr(n)[:40] for n, _ in REJECTIONS])
def test_rejected_names_name_the_rule(name, rule):
    with pytest.raises(InvalidTopicName) as ei:
        TopicName.parse(name)
    assert rule in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_longest_accepted_segment_and_name():
    seg = "x" * MAX_SEGMENT_LENGTH
    t = TopicName.parse(f"{seg}/{seg}/{'y' * 100}")
    assert (len(t.tenant), len(t.namespace), len(t.local_name)) == (MAX_SEGMENT_LENGTH, MAX_SEGMENT_LENGTH, 100)


@pytest.mark.parametrize("bad", [None, 42, b"orders", ["orders"]])
def test_non_string_name(bad):
    with pytest.raises(InvalidTopicName, match="topic name must be a string"):
        TopicName.parse(bad)


# ---- no accepted name escapes the root ------------------------------------------------------------

_NASTY = st.sampled_from(["/", "\\", ".", "..", ":", "-", "_", "=", "~", "\x00", "\n", " ", "%2e", "persistent://",
                          "-partition-", "0", "a", "Z", "\u2215", "\uff0e", "$HOME", "*"])
_RAW = st.lists(st.one_of(_NASTY, st.text(max_size=4)), max_size=12).map("".join)
_SEGMENT = st.text(alphabet="abcXYZ019_-=:.", min_size=1, max_size=12)
_VALIDISH = st.builds(lambda tn, ns, tp, p: f"{tn}/{ns}/{tp}{'' if p is None else f'-partition-{p}'}",
                      _SEGMENT, _SEGMENT, _SEGMENT, st.none() | st.integers(0, 10**6))


@pytest.fixture(scope="module")
def real_root(tmp_path_factory):
    path = os.path.realpath(str(tmp_path_factory.mktemp("naming-root")))
    return StorageRoot.resolve(path)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(_RAW, _VALIDISH, _VALIDISH.map(lambda s: "persistent://" + s)))
def test_no_accepted_name_resolves_outside_the_root(real_root, name):
    try:
        t = TopicName.parse(name)
    except InvalidTopicName:
        return
    base = real_root.url + os.sep
    segs = ("topics", *t.path_segments())
    paths = [real_root.uri(*segs), real_root.uri(*segs, "_topic.json")]
    if t.partition is not None:
        paths.append(real_root.uri(*segs, f"partition-{t.partition}"))
    for p in paths:
        resolved = os.path.realpath(p)
        assert resolved.startswith(base), (name, p, resolved)
        # Every segment stays a plain directory name: nothing collapses or climbs.
        assert resolved == os.path.normpath(p)
    for seg in t.path_segments():
        assert seg not in (".", "..") and "/" not in seg and "\\" not in seg and not seg.startswith(("_", "."))
    # Parsing is stable: the canonical name parses back to the same topic.
    assert TopicName.parse(str(t)) == t
