"""Suite 1: the crash matrix, on local disk and on Ceph RGW.

Every injection point (tests/reliability/crash.py: produce, add-partition, ack, the decision, marker
writing, pending-ack commit) x ``PULSARTX_CRASH_SEEDS`` seeds (``PULSARTX_CRASH_SEEDS_RGW`` on RGW): a child process is SIGKILLed at
that exact step, reads are taken before recovery, one coordinator-service pass recovers, and the
checker must find no anomaly; every transaction ends COMMITTED or ABORTED as the point dictates
(timed out before the decision, the child's decision after it).
"""
from __future__ import annotations

import copy
import os

import pytest

from . import crash
from .checker import check
from .final import rgw_root

# make test: 4 seeds on local disk, 2 on RGW (40 + 20 runs; ~2 min together on an idle 2-core machine);
# make reliability: 20 and 20 (PULSARTX_CRASH_SEEDS=20, which RGW follows unless PULSARTX_CRASH_SEEDS_RGW is set)
SEEDS = {"local": int(os.environ.get("PULSARTX_CRASH_SEEDS", "4")),
         "rgw": int(os.environ.get("PULSARTX_CRASH_SEEDS_RGW", os.environ.get("PULSARTX_CRASH_SEEDS", "2")))}


def test_at_least_eight_kill_points():
    assert len(crash.POINTS) >= 8


# (pytest-timeout's default 600 s is too short for the full matrix on a loaded machine)
@pytest.mark.timeout(300 + 15 * max(SEEDS.values()) * len(crash.POINTS))
@pytest.mark.parametrize("storage", ["local", "rgw"])
def test_crash_matrix(storage, tmp_path, request):
    if storage == "local":
        url, options = str(tmp_path / "root"), None
        os.makedirs(url)
    else:
        url, options = rgw_root(request, "crash")
    # children mostly wait on storage: more of them at once on S3, where each request is a round trip
    parallel = 3 if storage == "local" else 5
    seeds = SEEDS[storage]
    res = crash.run_matrix(url, options, list(crash.POINTS), seeds, str(tmp_path / "histories"), parallel)
    rep = res.report
    print(f"\ncrash matrix on {storage}: {res.runs} runs ({len(crash.POINTS)} points x {seeds} seeds), "
          f"outcomes {dict(res.outcomes)}, checker {dict(rep.anomalies.counts())}, stats {dict(rep.stats)}, "
          f"TC status at each kill {dict(res.status_at_kill)}, recovery sweep {res.swept}, "
          f"TC lease epochs {res.lease_epochs}, seconds { {k: round(v, 1) for k, v in res.seconds.items()} }")
    assert res.runs == len(crash.POINTS) * seeds
    assert res.per_point == {p: seeds for p in crash.POINTS}  # every child stopped where it was told
    assert rep.anomalies.total == 0, str(rep)
    assert res.wrong_outcome == []
    # each child was killed in the state its point names: undecided, or decided and unfinished
    for (point, status), _n in res.status_at_kill.items():
        assert status in (("OPEN",) if crash.POINTS[point] else ("COMMITTING", "ABORTING")), (point, status)
    # one transaction per run, each decided, and both outcomes of a decision really happened
    assert rep.stats["txns"] == res.runs
    assert rep.stats["txn_committed"] + rep.stats["txn_aborted"] == res.runs
    if seeds >= 4:
        assert rep.stats["txn_committed"] > 0
    assert rep.stats["batch_reads"] == res.runs and rep.stats["acks"] > 0
    # children never give their TC lease up (they are killed): with more runs than TC logs, later
    # children took dead ones' logs over (and swept them) as they began their transactions
    if res.runs > 16:
        assert sum(res.lease_epochs.values()) >= 1, res.lease_epochs

    # The same histories against what READ_UNCOMMITTED shows: the checker must see the aborted data
    # the killed transactions left in storage (so a leak in the real read path could not go unseen).
    uncommitted = copy.copy(res.final)
    uncommitted.visible = {t: sorted((p, o, v) for p, o, v, _t in rows) for t, rows in res.final.stored.items()}
    leaked = check(res.events, uncommitted).anomalies
    assert leaked.aborted_read > 0 and leaked.aborted_read == sum(
        1 for rows in res.final.stored.values() for *_x, t in rows
        if t is not None and res.final.txn_status.get(t) == "ABORTED"), leaked
