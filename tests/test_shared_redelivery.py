"""Shared and Key_Shared redelivery with a second live consumer: a message given back (negative
ack, unacked timeout) reaches another consumer only after its negative-ack delay, carrying its
raised redelivery count, and a consumer whose ack grouping is slower than its renewals keeps what
it holds. Real Delta tables, public API."""
from __future__ import annotations

import pytest

from pulsartx import Client, ConsumerDeadLetterPolicy, ConsumerType, InitialPosition, MessageId, Timeout

pytestmark = pytest.mark.timeout(60)
E = InitialPosition.Earliest
CLAIMING = [ConsumerType.Shared, ConsumerType.KeyShared]


@pytest.fixture
def client(tmp_path):
    c = Client(str(tmp_path), num_coordinators=1)
    yield c
    c.close()


def _seed(client, n: int) -> None:
    client.admin.create_topic("src", partitions=1)
    p = client.create_producer("src")
    for i in range(n):
        p.send(f"m{i}".encode(), partition_key=f"k{i}")
    p.close()


@pytest.mark.parametrize("ctype", CLAIMING)
def test_negative_ack_delay_holds_for_other_consumers(client, ctype):
    _seed(client, 1)
    c1 = client.subscribe("src", "s", ctype, initial_position=E, negative_ack_redelivery_delay_ms=60_000)
    c2 = client.subscribe("src", "s", ctype, initial_position=E)
    c1.negative_acknowledge(c1.receive(1000))
    with pytest.raises(Timeout):
        c2.receive(700)
    c1.close()  # a closing consumer gives back at once what waits on its delay
    m = c2.receive(2000)
    assert (m.data(), m.redelivery_count()) == (b"m0", 1)


@pytest.mark.parametrize("ctype", CLAIMING)
def test_ack_timeout_redelivery_to_other_consumer_is_counted(client, ctype):
    _seed(client, 1)
    # A claim lasts one unacked timeout past its last renewal (every third of it): at 200 ms a
    # background thread stalled ~150 ms by CPU load let the claim lapse, as a dead consumer's, and
    # c2 took the message before c1's timeout counted the redelivery.
    c1 = client.subscribe("src", "s", ctype, initial_position=E, unacked_messages_timeout_ms=1000)
    c2 = client.subscribe("src", "s", ctype, initial_position=E)
    c1.receive(1000)
    m = c2.receive(5000)
    assert (m.data(), m.redelivery_count()) == (b"m0", 1)


@pytest.mark.parametrize("ctype", CLAIMING)
def test_dead_letter_after_exactly_n_deliveries_across_consumers(client, ctype):
    _seed(client, 1)
    opts = dict(initial_position=E, negative_ack_redelivery_delay_ms=0,
                dead_letter_policy=ConsumerDeadLetterPolicy(2))
    cs = [client.subscribe("src", "sub", ctype, **opts) for _ in range(2)]
    counts = []
    for _ in range(10):
        for c in cs:
            try:
                m = c.receive(300)
            except Timeout:
                continue
            counts.append(m.redelivery_count())
            c.negative_acknowledge(m)
    assert counts == [0, 1, 2]
    r = client.create_reader("src-sub-DLQ", MessageId.earliest)
    assert r.read_next(2000).data() == b"m0"
    with pytest.raises(Timeout):
        r.read_next(300)


@pytest.mark.parametrize("ctype", CLAIMING)
def test_slow_ack_grouping_keeps_lease_and_claims(client, ctype):
    _seed(client, 1)
    c1 = client.subscribe("src", "s", ctype, initial_position=E, lease_ms=300, acknowledgment_group_time_ms=2000)
    c2 = client.subscribe("src", "s", ctype, initial_position=E, lease_ms=300)
    c1.receive(1000)
    with pytest.raises(Timeout):
        c2.receive(1200)


@pytest.mark.parametrize("ctype", CLAIMING)
def test_redelivery_count_is_read_after_the_claim(client, ctype):
    """A fetch reads the cursor, then claims. A consumer that stores a raised redelivery count and
    then releases its claim between the two (here by closing) must not make the message go out
    with the count from before: the one that counts is the count stored when the claim is taken."""
    _seed(client, 1)
    # x stores its redelivery counts when it closes, not on its grouping timer.
    x = client.subscribe("src", "s", ctype, initial_position=E, negative_ack_redelivery_delay_ms=0,
                         acknowledgment_group_time_ms=60_000)
    x.negative_acknowledge(x.receive(1000))  # x keeps its claim until the raised count is stored
    y = client.subscribe("src", "s", ctype, initial_position=E)
    resolve = y._resolve_pending

    def after_cursor_read(*args, **kwargs):
        # Within y's fetch, after its cursor read and before it looks at the claims.
        y._resolve_pending = resolve
        x.close()  # stores the count, 1, then releases x's claim (and, Key_Shared, its keys)
        if y._key_shared is not None:
            y._key_shared.refresh()  # y owns every key from now
        return resolve(*args, **kwargs)

    y._resolve_pending = after_cursor_read
    m = y.receive(3000)
    assert (m.data(), m.redelivery_count()) == (b"m0", 1)


@pytest.mark.parametrize("ctype", CLAIMING)
def test_negative_ack_keeps_claims_on_acks_not_stored_yet(client, ctype):
    """A negative ack releases the claims of what the consumer no longer holds, but not those of
    messages it acknowledged whose ack is still grouped: another consumer received those again."""
    _seed(client, 2)
    x = client.subscribe("src", "s", ctype, initial_position=E, negative_ack_redelivery_delay_ms=0,
                         acknowledgment_group_time_ms=60_000)
    x.acknowledge(x.receive(1000))  # grouped: not in the cursor yet
    x.negative_acknowledge(x.receive(1000))  # its count is not stored either: x keeps that claim
    if x._key_shared is not None:
        x._key_shared.leave()  # x keeps its claims: y owns every key
    y = client.subscribe("src", "s", ctype, initial_position=E)
    with pytest.raises(Timeout):
        y.receive(700)
    x.close()  # stores the ack and the count, then gives back m1
    m = y.receive(3000)
    assert (m.data(), m.redelivery_count()) == (b"m1", 1)
