"""The fault matrix: the concurrency soak (tests/reliability/soak.py: 9 processes, transactional and
plain producers, consume-transform-produce, readers, the coordinator service, compaction and
snapshots, an operator's admin aborts and TC-log trims) with storage faults injected under every
process, then the Jepsen-style checker.

Faults come from the storage fail points (pulsartx/storage/faults.py), installed in each process
through ``PULSARTX_FAULTS``, at a steady rate (one call of a kind in N, at random), so they land
inside every step of produce, commit, abort, acknowledgement and compaction. A fault class is one soak run:

=================  ===================================================================================
transient-reads    a dropped connection on one read in 25 (retried within the retry budget)
read-errors        a permanent I/O error on one read in 60: operations fail, state must not diverge
list-errors        an I/O error on one listing or existence check in 20
write-errors       an I/O error on one create in 40 and one whole-file write in 40
lost-responses     one create in 30 takes effect, then the caller sees an error
http500            one create in 30 takes effect, then answers HTTP 500 (Ceph RGW's answer to a race)
clock-jumps        the coordinator service's clock 8 days ahead (every open transaction looks expired to
                   it), a transactional producer's 8 days behind (its app ids expire at once)
retention          retention deletes the subscribed topic's acknowledged files beside the live
                   transactions, compaction and snapshots (no storage faults)
mixed              all of the storage faults above at once, at half their rates
=================  ===================================================================================

``make test`` runs ``mixed`` for 20 s on local disk; ``make reliability`` (PULSARTX_FAULT_MATRIX=all)
runs every class for PULSARTX_FAULT_SECONDS (default 45) on local disk and on Ceph RGW.
"""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from pulsartx.storage.faults import Fault, Mode, Op, env_value

from . import soak
from .final import rgw_root

DAY = 86_400.0
CLASSES: dict[str, tuple[list[Fault], dict[str, float]]] = {
    "transient-reads": ([Fault(Op.READ, transient=True, every=25)], {}),
    "read-errors": ([Fault(Op.READ, every=60)], {}),
    "list-errors": ([Fault(Op.LIST, every=20)], {}),
    "write-errors": ([Fault(Op.CREATE, every=40), Fault(Op.WRITE, every=40)], {}),
    "lost-responses": ([Fault(Op.CREATE, Mode.LOST, every=30)], {}),
    "http500": ([Fault(Op.CREATE, Mode.HTTP500, after=True, every=30)], {}),
    "clock-jumps": ([], {"service": 8 * DAY, "txn-1": -8 * DAY}),
    "retention": ([], {}),
    "mixed": ([Fault(Op.READ, transient=True, every=50), Fault(Op.READ, every=120), Fault(Op.LIST, every=40),
               Fault(Op.CREATE, every=80), Fault(Op.CREATE, Mode.LOST, every=60),
               Fault(Op.CREATE, Mode.HTTP500, after=True, every=70), Fault(Op.WRITE, every=80)], {}),
}
MATRIX = os.environ.get("PULSARTX_FAULT_MATRIX", "mixed")
SELECTED = list(CLASSES) if MATRIX == "all" else [c.strip() for c in MATRIX.split(",") if c.strip()]
STORAGES = {"local": ["local"], "rgw": ["rgw"], "all": ["local", "rgw"]}[
    os.environ.get("PULSARTX_FAULT_STORAGE", "all" if MATRIX == "all" else "local")]
SECONDS = float(os.environ.get("PULSARTX_FAULT_SECONDS", "45" if MATRIX == "all" else "20"))


def fired(hist_dir: str) -> Counter:
    """Faults that really fired, by kind, from every process's fail-point log."""
    out: Counter = Counter()
    for name in os.listdir(hist_dir):
        if name.endswith(".faults.log"):
            with open(os.path.join(hist_dir, name)) as f:
                for line in f:
                    e = json.loads(line)
                    out[f"{e['op']}:{e['mode']}{':after' if e['after'] and e['mode'] != 'lost' else ''}"] += 1
    return out


@pytest.mark.timeout(int(SECONDS) + 900)
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("fault_class", SELECTED)
def test_fault_class(fault_class, storage, tmp_path, request):
    plan, skew = CLASSES[fault_class]
    if storage == "local":
        url, options = str(tmp_path / "root"), None
        os.makedirs(url)
    else:
        url, options = rgw_root(request, f"faults-{fault_class}")
    hist = str(tmp_path / "histories")
    res = soak.run_soak(url, options, SECONDS, hist, fault_env=env_value(plan) if plan else None, skew=skew,
                        retention=fault_class == "retention")
    rep = res.report
    faults = fired(hist)
    print(f"\nfault class {fault_class} on {storage}: {res.seconds:.0f} s, {res.committed_txns} committed "
          f"transactions, {rep.stats['txn_aborted']} aborted, {rep.stats['sends']} sends, faults fired "
          f"{dict(faults)} (total {sum(faults.values())}), anomalies {rep.anomalies.counts()}, "
          f"processes {res.results}")
    assert rep.anomalies.total == 0, str(rep)
    assert res.committed_txns > 0 and rep.stats["polled"] > 0
    if plan:
        assert sum(faults.values()) > 0, "no fault fired: the class tested nothing"
    if fault_class == "retention":
        assert res.results["maint"]["retention_files_deleted"] > 0, "retention deleted nothing"
