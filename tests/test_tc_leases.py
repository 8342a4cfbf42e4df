"""TC leases, with real processes and real storage: each process begins its transactions on a TC
log of its own while there are enough; a dead owner's log is taken over, swept and finished; a
paused owner that lost its lease is refused when it tries to renew; clocks that disagree delay or
hasten a takeover but never give a log two owners; processes outnumbering logs share them."""
from __future__ import annotations

import os
import signal
import time

from _procs import Child, count_markers, read_tc_log
from _reads import committed_values

import pulsartx
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import TxnStatus
from pulsartx.coordinator.tclog import TransactionLog
from pulsartx.storage.root import StorageRoot

TOPIC = "leased"


def _root(tmp_path, tcs: int) -> str:
    root = str(tmp_path / "root")
    with pulsartx.Client(root, num_coordinators=tcs) as c:
        c.admin.create_topic(TOPIC, partitions=2)
        assert c._coordinators().count == tcs  # fixed at the root's first use
    return root


def _lease_row(root: str, tc_id: int):
    return TransactionLog(StorageRoot.resolve(root), tc_id).open().lease()


def _go(tmp_path, name: str = "go") -> str:
    path = str(tmp_path / name)
    open(path, "w").close()
    return path


def test_each_process_begins_its_transactions_on_a_tc_log_of_its_own(tmp_path):
    root = _root(tmp_path, tcs=4)
    go = str(tmp_path / "go")
    # the workers keep their leases at the end (a closing client gives its lease up, and a worker
    # that started late could take the lease of one that had already finished)
    workers = [Child("lease_worker", root=root, topic=TOPIC, wid=w, n=15, go_file=go, close=False)
               for w in range(3)]
    _go(tmp_path)
    results = [w.result() for w in workers]
    used = [set(r["tcs"]) for r in results]
    assert all(len(u) == 1 for u in used), used  # every transaction of a process on its one TC
    tcs = [u.pop() for u in used]
    assert len(set(tcs)) == 3, tcs  # three processes, three logs
    assert [r["lease"][0] for r in results] == tcs
    assert sorted(committed_values(pulsartx.Client(root), TOPIC)) == sorted(
        f"{w}:{i}".encode() for w in range(3) for i in range(15))
    for r, tc in zip(results, tcs, strict=True):
        lease = _lease_row(root, tc)
        assert (lease.owner, lease.epoch, lease.released) == (r["lease"][1], 0, False)


def test_a_closing_client_gives_its_lease_up_and_the_next_process_takes_it_at_once(tmp_path):
    root = _root(tmp_path, tcs=1)
    first = Child("lease_worker", root=root, topic=TOPIC, wid=0, n=2, go_file=_go(tmp_path)).result()
    lease = _lease_row(root, 0)
    assert (lease.owner, lease.epoch, lease.released) == (first["lease"][1], 0, True)
    second = Child("lease_worker", root=root, topic=TOPIC, wid=1, n=2, go_file=_go(tmp_path)).result()
    assert second["lease"][0] == 0 and second["lease"][2] == 1  # taken at once, not after 30 s


def test_a_dead_owners_log_is_taken_over_swept_and_finished(tmp_path):
    root = _root(tmp_path, tcs=1)
    cfg = {"lease_ms": 1000, "max_clock_skew_ms": 0}
    a = Child("lease_holder", root=root, topic=TOPIC, go_file=str(tmp_path / "never"), cfg=cfg, open_timeout_ms=1500)
    held = a.wait_event("held")
    tc, owner, epoch = held["lease"]
    a.sigkill()
    decided, opened = tuple(held["decided"]), tuple(held["open"])
    log = read_tc_log(root, tc)
    assert log[decided[1]].status is TxnStatus.COMMITTING and log[opened[1]].status is TxnStatus.OPEN
    assert count_markers(root, TOPIC, 2) == {}
    time.sleep(1.6)  # A's lease and its open transaction's timeout both pass
    b = pulsartx.Client(root, coordinator_config=CoordinatorConfig(lease_ms=1000, max_clock_skew_ms=0,
                                                                   recovery_grace_ms=0))
    txn = b.new_transaction()
    assert txn.id.most_bits == tc
    held_b = b._coordinators().leased
    assert (held_b[0], held_b[1].owner != owner, held_b[1].epoch) == (tc, True, epoch + 1)
    log = read_tc_log(root, tc)  # the new owner swept at takeover: A's decided one finished, its open one aborted
    assert (log[decided[1]].status, log[opened[1]].status) == (TxnStatus.COMMITTED, TxnStatus.ABORTED)
    assert sorted(count_markers(root, TOPIC, 2).values()) == [1, 1]
    assert committed_values(b, TOPIC) == [b"decided"]
    txn.abort()
    b.close()


def test_a_paused_owner_that_lost_its_lease_is_refused_and_moves_on(tmp_path):
    root = _root(tmp_path, tcs=1)
    cfg = {"lease_ms": 1000, "max_clock_skew_ms": 0}
    go = str(tmp_path / "go")
    z = Child("lease_holder", root=root, topic=TOPIC, go_file=go, cfg=cfg, open_timeout_ms=1000)
    tc, z_owner, z_epoch = z.wait_event("held")["lease"]
    os.kill(z.proc.pid, signal.SIGSTOP)  # a long GC pause, a VM migration
    try:
        time.sleep(1.2)
        # C's own lease is long: Z, resumed however late, must find it held, not expired as well
        c = pulsartx.Client(root, coordinator_config=CoordinatorConfig(**{**cfg, "lease_ms": 60_000}))
        c.new_transaction().abort()  # takes the expired lease over
        c_owner = c._coordinators().leased[1].owner
    finally:
        os.kill(z.proc.pid, signal.SIGCONT)
    _go(tmp_path)
    after = z.result()
    # the zombie's renewal was refused: it holds no lease, and the log's lease is still the new owner's
    assert after["lease"] is None
    lease = _lease_row(root, tc)
    assert (lease.owner, lease.epoch, lease.released) == (c_owner, z_epoch + 1, False)
    # its own transaction still committed, on the log it now shares by compare-and-set
    assert after["tc"] == tc
    assert sorted(committed_values(c, TOPIC)) == [b"after", b"decided"]  # its open one expired, aborted at takeover
    c.close()
    assert _lease_row(root, tc).released


def test_clocks_that_disagree_delay_or_hasten_a_takeover_but_never_make_two_owners(tmp_path):
    root = _root(tmp_path, tcs=1)
    cfg = {"lease_ms": 60_000, "max_clock_skew_ms": 10_000}
    a = Child("lease_holder", root=root, topic=TOPIC, go_file=str(tmp_path / "never"), cfg=cfg)
    tc, a_owner, a_epoch = a.wait_event("held")["lease"]
    a.sigkill()
    # a clock 10 minutes behind sees A's dead lease as live: the takeover waits; the log is shared
    behind = Child("lease_worker", root=root, topic=TOPIC, wid=1, n=3, go_file=_go(tmp_path), cfg=cfg,
                   clock_offset_s=-600).result()
    assert behind["lease"] is None and set(behind["tcs"]) == {tc}
    lease = _lease_row(root, tc)
    assert (lease.owner, lease.epoch, lease.released) == (a_owner, a_epoch, False)
    # a live owner, Z, takes the lease once it is free; a clock 10 minutes ahead takes it from Z
    # long before it expires (and keeps it: that process dies without giving it up)
    go = str(tmp_path / "go-z")
    z = Child("lease_holder", root=root, topic=TOPIC, go_file=go, cfg={**cfg, "max_clock_skew_ms": -600_000})
    z_tc, z_owner, z_epoch = z.wait_event("held")["lease"]
    assert (z_tc, z_epoch) == (tc, a_epoch + 1)
    ahead = Child("lease_worker", root=root, topic=TOPIC, wid=2, n=3, go_file=_go(tmp_path), cfg=cfg,
                  clock_offset_s=600, close=False).result()
    assert ahead["lease"][2] == z_epoch + 1 and set(ahead["tcs"]) == {tc}
    # Z goes on: it sees the log's lease is no longer its own and holds none; it never wrote one again
    open(go, "w").close()
    after = z.result()
    assert after["lease"] is None and after["tc"] == tc
    lease = _lease_row(root, tc)
    assert (lease.owner, lease.epoch, lease.released) == (ahead["lease"][1], z_epoch + 1, False)
    assert sorted(committed_values(pulsartx.Client(root), TOPIC)) == sorted(
        [b"decided", b"decided", b"after", b"1:0", b"1:1", b"1:2", b"2:0", b"2:1", b"2:2"])


def test_more_processes_than_logs_share_them_and_stay_exact(tmp_path):
    root = _root(tmp_path, tcs=2)
    go = str(tmp_path / "go")
    workers = [Child("lease_worker", root=root, topic=TOPIC, wid=w, n=12, go_file=go, close=False)
               for w in range(4)]
    _go(tmp_path)
    results = [w.result() for w in workers]
    leased = [r["lease"] for r in results if r["lease"] is not None]
    assert sorted(lease[0] for lease in leased) == [0, 1]  # two hold a lease, one log each; two share
    assert all(len(set(r["tcs"])) == 1 for r in results)  # a process without a lease sticks to one log too
    assert sorted(committed_values(pulsartx.Client(root), TOPIC)) == sorted(
        f"{w}:{i}".encode() for w in range(4) for i in range(12))


def test_processes_of_one_owner_name_share_its_lease(tmp_path):
    """A Spark driver's Python workers lease under the driver's name: the first takes a log, the
    others adopt that lease instead of taking logs of their own, and their renewals do not take it
    from each other."""
    from pulsartx.coordinator.registry import Coordinators

    root = StorageRoot.resolve(_root(tmp_path, tcs=4))
    workers = [Coordinators(root, recover_on_open=False) for _ in range(3)]
    for w in workers:
        w.use_lease_owner("host:1:spark-driver-7")
    tc_ids = [w.pick() for w in workers]
    assert len(set(tc_ids)) == 1
    lease = _lease_row(str(root.url), tc_ids[0])
    assert (lease.owner, lease.epoch, lease.released) == ("host:1:spark-driver-7", 0, False)
    for _ in range(3):  # each renews in turn; none loses the lease to another's renewal
        for w in workers:
            w._renew_at = 0.0
            assert w.pick() == tc_ids[0] and w.leased is not None
    assert _lease_row(str(root.url), tc_ids[0]).epoch == 0
    other = Coordinators(root, recover_on_open=False)
    assert other.pick() != tc_ids[0]  # another client's name: a log of its own
