"""Subscription leases across a subscription's deletion: a consumer of the deleted subscription,
still open somewhere, must not take or renew a lease of the one re-created under its name, however
its writes interleave with the deletion's (pulsartx/subscription/leases.py)."""
from __future__ import annotations

from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot
from pulsartx.subscription.leases import LeaseStore

TOPIC = TopicName.parse("t")


def stores(tmp_path, n: int) -> list[LeaseStore]:
    """``n`` handles on one subscription's lease table, as ``n`` processes hold them."""
    root = StorageRoot(str(tmp_path / "root"))
    return [LeaseStore(root, TOPIC, "s") for _ in range(n)]


def test_a_deleted_subscriptions_consumer_neither_renews_nor_retakes_its_lease(tmp_path):
    old, admin, new = stores(tmp_path, 3)
    assert old.try_acquire("old", 60_000)
    assert admin.end()
    assert admin.holder() is None
    assert not old.try_acquire("old", 60_000) and old.ended
    assert new.try_acquire("new", 60_000)
    new.release("new")
    assert not old.try_acquire("old", 60_000)  # a free lease, but not of its subscription
    assert new.try_acquire("new", 60_000)


def test_a_renewal_whose_snapshot_predates_the_deletion_is_refused(tmp_path, monkeypatch):
    """The deletion lands between the renewal's read of the lease table and its write: the write
    must fail as a compare-and-set (and be refused when re-tried), not land after the deletion
    emptied the rows, which would leave the old consumer holding the lease."""
    old, admin, new = stores(tmp_path, 3)
    assert old.try_acquire("old", 60_000)
    assert old.join_shared("old", 60_000)
    real = old.log.put
    deleted: list[bool] = []

    def put_after_the_deletion(rows, *a, **kw):
        if not deleted:
            deleted.append(admin.end())
        return real(rows, *a, **kw)

    monkeypatch.setattr(old.log, "put", put_after_the_deletion)
    assert not old.try_acquire("old", 60_000)
    assert deleted == [True]
    assert not old.join_shared("old", 60_000)
    assert admin.holder() is None and admin.live_members() == []
    assert new.try_acquire("new", 60_000)


def test_a_standbys_take_whose_snapshot_predates_the_deletion_is_refused(tmp_path, monkeypatch):
    """A Failover standby of the deleted subscription takes the lease its active consumer released,
    and the deletion lands between the take's read and its write. The deletion has no live row to
    empty, so only the compare-and-set on the incarnation stops the take from landing after it
    (it did without it: the old standby then held the re-created subscription's lease)."""
    active, standby, admin, new = stores(tmp_path, 4)
    assert active.try_acquire("active", 60_000)
    assert not standby.try_acquire("standby", 60_000)  # a standby: it adopted the incarnation
    active.release("active")
    real = standby.log.put
    deleted: list[bool] = []

    def put_after_the_deletion(rows, *a, **kw):
        if not deleted:
            deleted.append(admin.end())
        return real(rows, *a, **kw)

    monkeypatch.setattr(standby.log, "put", put_after_the_deletion)
    assert not standby.try_acquire("standby", 60_000) and standby.ended
    assert deleted == [True] and admin.holder() is None
    assert new.try_acquire("new", 60_000)


def test_an_unsubscribing_consumer_does_not_end_a_re_created_subscriptions_leases(tmp_path):
    old, admin, new = stores(tmp_path, 3)
    assert old.join_shared("old", 60_000)
    admin.end()
    assert new.join_shared("new", 60_000)
    assert not old.end(old.incarnation)
    assert new.join_shared("new", 60_000) and admin.live_members() == ["new"]
