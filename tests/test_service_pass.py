"""The coordinator service's pass (``pulsartx coordinator run``): what it must survive."""
from __future__ import annotations

import glob
import os

import pytest

import pulsartx
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.coordinator.txnid import TxnID
from pulsartx.service import CoordinatorService

# Decided transactions are left for a sweep to roll forward (no recovery at open), on any TC.
HOLD = CoordinatorConfig(recovery_grace_ms=10**9, lease_ms=0)


def test_a_service_pass_goes_on_past_a_topic_deleted_while_it_lists_them(tmp_path, monkeypatch):
    """A topic listed, then deleted by another process before the pass reads its partitions, must
    not end the pass: the topics after it are settled all the same (every pass would otherwise
    skip them while topics come and go)."""
    from pulsartx import service  # its settle is patched

    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    for name in ("a-kept", "gone", "z-kept"):
        client.admin.create_topic(name, 1)
    listed = client.admin.list_topics()
    client.admin.delete_topic("gone")
    monkeypatch.setattr(client.admin, "list_topics", lambda: listed)
    settled: list[str] = []
    real_settle = service.settle

    def recording(coordinators, buf, **kw):
        settled.append(str(buf.log.topic))
        return real_settle(coordinators, buf, **kw)

    monkeypatch.setattr(service, "settle", recording)
    svc = service.CoordinatorService(client, grace_ms=0)
    svc.run_pass()
    assert settled == ["persistent://public/default/a-kept-partition-0",
                       "persistent://public/default/z-kept-partition-0"], settled
    client.close()


def _tc0_damaged_after_two_decisions(root: str) -> dict[int, TxnID]:
    """On each of two TCs, a transaction decided COMMITTING whose owner stopped before its markers;
    then TC 0's last commit file cut in half (a damaged log). Returns the TxnID per TC."""
    client = pulsartx.Client(root, num_coordinators=2, coordinator_config=HOLD)
    client.admin.create_topic("t", 1)
    decided = {}
    for tc_id in (0, 1):
        tc = client._coordinators().tc(tc_id)
        meta = tc.new_transaction(60_000, partitions=["persistent://public/default/t-partition-0"])

        def stop(_meta):
            raise RuntimeError("killed after the decision")

        with pytest.raises(RuntimeError):
            tc.end_transaction(meta.txn_id, TxnAction.COMMIT, before_participants=stop)
        decided[tc_id] = meta.txn_id
    client.close()
    commits = sorted(glob.glob(os.path.join(root, "coordinator", "tc-0", "log", "_delta_log", "*.json")))
    with open(commits[-1], "r+b") as f:
        f.truncate(os.path.getsize(commits[-1]) // 2)
    return decided


def _committed_on_tc1(root: str, txn_id: TxnID) -> bool:
    fresh = pulsartx.Client(root, coordinator_config=HOLD)
    return fresh._coordinators().tc(1).get(txn_id, refresh=True).status is TxnStatus.COMMITTED


def test_a_service_pass_sweeps_every_other_tc_when_one_tc_log_is_unreadable(tmp_path):
    """One TC log damaged on disk (restoring it is an operator's job) must not stop the sweeps of
    the others: their decided transactions are still rolled forward and their expired ones
    aborted, so readers are not held and markers get written."""
    root = str(tmp_path / "root")
    decided = _tc0_damaged_after_two_decisions(root)
    svc = CoordinatorService(pulsartx.Client(root, coordinator_config=CoordinatorConfig(lease_ms=0)), grace_ms=0)
    svc.run_pass()
    assert any("TC 0" in e for e in svc.stats.errors), svc.stats.errors  # named, and the pass went on
    assert _committed_on_tc1(root, decided[1])


def test_an_admin_sweep_sweeps_the_other_tcs_then_raises_the_unreadable_ones_error(tmp_path):
    root = str(tmp_path / "root")
    decided = _tc0_damaged_after_two_decisions(root)
    admin = pulsartx.Client(root, coordinator_config=CoordinatorConfig(lease_ms=0))
    with pytest.raises(Exception, match="tc-0"):
        admin.admin.transactions.sweep(grace_ms=0)
    assert _committed_on_tc1(root, decided[1])


def test_admin_views_list_the_other_tcs_and_name_the_unreadable_one(tmp_path, caplog):
    """Coordinator stats, the coordinators list and the transaction listings read every TC log:
    one damaged log must not make them fail as a whole (an operator needs them most then). The
    unreadable TC is a row of its own with its error, and a warning names it."""
    root = str(tmp_path / "root")
    decided = _tc0_damaged_after_two_decisions(root)
    admin = pulsartx.Client(root, coordinator_config=HOLD).admin.transactions
    with caplog.at_level("WARNING"):
        stats = admin.get_coordinator_stats()
    assert any("TC 0" in r.getMessage() and "tc-0" in r.getMessage() for r in caplog.records), caplog.records
    assert [(s["coordinator_id"], s["state"]) for s in stats] == [(0, "Unreadable"), (1, "Ready")]
    assert "tc-0" in stats[0]["error"] and stats[0]["committing"] is None
    assert stats[1]["committing"] == 1 and "error" not in stats[1]
    assert set(stats[0]) == set(stats[1]) | {"error"}  # the same columns, so tables and JSON line up
    listing = admin.list_coordinators()
    assert [(c["coordinator_id"], c["state"]) for c in listing] == [(0, "Unreadable"), (1, "Ready")]
    assert "tc-0" in listing[0]["error"]
    for rows in (admin.list_transactions(), admin.get_slow_transactions(0)):
        assert [(r["coordinator_id"], r["status"], r["txn_id"]) for r in rows] == [
            (0, "UNREADABLE", None), (1, "COMMITTING", str(decided[1]))]
        assert "tc-0" in rows[0]["error"] and set(rows[0]) == set(rows[1]) | {"error"}


def test_the_cli_prints_valid_json_and_an_error_column_for_an_unreadable_tc(tmp_path):
    import json

    from click.testing import CliRunner

    from pulsartx.cli.main import cli

    root = str(tmp_path / "root")
    _tc0_damaged_after_two_decisions(root)
    r = CliRunner().invoke(cli, ["--service-url", root, "--json", "transactions", "coordinator-stats"])
    assert r.exit_code == 0, (r.stdout, r.stderr, r.exception)
    assert [s["state"] for s in json.loads(r.stdout)] == ["Unreadable", "Ready"]
    r = CliRunner().invoke(cli, ["--service-url", root, "transactions", "list"])
    assert r.exit_code == 0, (r.stdout, r.stderr, r.exception)
    head, bad, good = r.stdout.splitlines()
    assert head.split()[-1] == "ERROR"
    assert "UNREADABLE" in bad and "tc-0" in bad and "COMMITTING" in good


def test_metrics_report_the_other_tcs_and_flag_the_unreadable_one(tmp_path):
    from pulsartx import metrics

    root = str(tmp_path / "root")
    _tc0_damaged_after_two_decisions(root)
    text = metrics.generate_latest(pulsartx.Client(root, coordinator_config=HOLD))
    assert 'pulsar_txn_active_count{coordinator_id="1"} 1.0' in text
    assert 'pulsar_txn_active_count{coordinator_id="0"}' not in text  # unknown, not 0
    assert 'pulsartx_coordinator_log_unreadable{coordinator_id="0"} 1.0' in text
    assert 'pulsartx_coordinator_log_unreadable{coordinator_id="1"} 0.0' in text


def test_a_store_down_for_long_keeps_the_service_errors_bounded_and_logs_once(tmp_path, monkeypatch, caplog):
    """A pass that fails as a whole (the store unreachable) was appended to the service's errors
    without bound and logged at WARNING every pass: a store down for a day at one pass a second
    made 86,400 list entries and log lines. The list is bounded as a partition's failures are, and
    the same error is logged at WARNING once, then at DEBUG while it repeats."""
    from pulsartx.storage.retry import StorageUnavailable

    svc = CoordinatorService(pulsartx.Client(str(tmp_path / "root")), sweep_interval_s=0)
    passes = 0

    def down() -> None:
        nonlocal passes
        passes += 1
        if passes >= 300:
            svc.stop()
        raise StorageUnavailable("list s3://bucket/prefix: unreachable after 30 s of retries")

    monkeypatch.setattr(svc, "run_pass", down)
    with caplog.at_level("WARNING", logger="pulsartx.service"):
        svc.run(install_signals=False)
    assert svc.stats.passes == 300
    assert 1 <= len(svc.stats.errors) <= 100
    assert sum("coordinator pass failed" in r.getMessage() for r in caplog.records if r.levelname == "WARNING") == 1


def test_a_partition_that_fails_again_after_recovering_is_warned_about_again(tmp_path, monkeypatch, caplog):
    """A failing partition is logged at WARNING once, then at DEBUG while the same error repeats;
    but once it has been maintained again, the same error coming back is a new outage, and was
    logged at DEBUG only (invisible at the default level)."""
    from pulsartx import service

    root = str(tmp_path / "root")
    client = pulsartx.Client(root)
    client.admin.create_topic("t", 1)
    real_settle = service.settle
    broken = iter([True, True, False, True])

    def flaky(coordinators, buf, **kw):
        if next(broken):
            raise OSError("disk read error")
        return real_settle(coordinators, buf, **kw)

    monkeypatch.setattr(service, "settle", flaky)
    svc = service.CoordinatorService(client, grace_ms=0)
    with caplog.at_level("WARNING", logger="pulsartx.service"):
        for _ in range(4):
            svc.run_pass()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 2 and all("disk read error" in w for w in warned), warned
