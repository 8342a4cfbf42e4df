"""Suite 2: the concurrency soak (tests/reliability/soak.py), 8 processes at once.

``PULSARTX_SOAK_SECONDS`` (default 60) bounds it; ``PULSARTX_SOAK_STORAGE`` = local (default), rgw or
all. The checker must find no anomaly, and every role must really have done its work.
"""
from __future__ import annotations

import os

import pytest

from . import soak
from .final import rgw_root

SECONDS = float(os.environ.get("PULSARTX_SOAK_SECONDS", "60"))
STORAGES = {"local": ["local"], "rgw": ["rgw"], "all": ["local", "rgw"]}[
    os.environ.get("PULSARTX_SOAK_STORAGE", "local")]


@pytest.mark.timeout(int(SECONDS) + 900)
@pytest.mark.parametrize("storage", STORAGES)
def test_concurrency_soak(storage, tmp_path, request):
    if storage == "local":
        url, options = str(tmp_path / "root"), None
        os.makedirs(url)
    else:
        url, options = rgw_root(request, "soak")
    res = soak.run_soak(url, options, SECONDS, str(tmp_path / "histories"))
    rep = res.report
    print(f"\nsoak on {storage}: {res.seconds:.0f} s, {res.committed_txns} committed transactions "
          f"({res.txns_per_second:.1f}/s), checker {rep.anomalies.counts()}, stats {dict(rep.stats)}, "
          f"stuck limit {res.stuck_limit_s:.1f} s, processes {res.results}")
    assert rep.anomalies.total == 0, str(rep)
    assert res.results["maint"]["errors"] == 0, res.results["maint"]["first_errors"]
    r = res.results
    # every role did its share, and the interesting races happened
    assert r["txn-0"]["committed"] > 0 and r["txn-1"]["committed"] > 0 and r["plain"]["values"] > 0
    assert r["xform-1"]["committed"] > 0 and r["xform-2"]["committed"] > 0
    assert r["reader"]["batch_reads"] > 0 and r["service"]["passes"] > 0 and r["maint"]["snapshots"] > 0
    assert rep.stats["txn_aborted"] > 0 and rep.stats["polled"] > 0 and rep.stats["acks"] > 0
    assert rep.stats["drained"] >= 0
