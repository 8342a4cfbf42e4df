"""Model-based tests of the keyed log and of the TC over it, with storage faults.

Several instances (one per "process") share one real Delta table on disk; hypothesis drives
compare-and-sets, refreshes and compactions from any of them, and injects a fault into the next
storage call (a failed or lost read or write, an HTTP 500 after a write took effect, a failed
table open). After every step the table is read afresh and checked against a reference model:
  * a write reported successful is durable, with its value;
  * a write that raised is either absent or present, never half, and the model learns which;
  * two writes never both succeed with the same key and seq (one outcome per decision);
  * no instance ever shows a row newer than storage, and all agree once refreshed.
The TC machine does the same for transaction outcomes: no transaction is ever reported COMMITTED
by one coordinator and ABORTED by another, and what a fresh TC reads is what was reported.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pulsartx.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from pulsartx.coordinator.state import TxnAction, TxnStatus
from pulsartx.exceptions import PulsarException
from pulsartx.storage import faults
from pulsartx.storage.faults import Fault, Mode, Op
from pulsartx.storage.keyed_log import KeyedLog
from pulsartx.storage.root import StorageRoot

SCALE = max(1, int(os.environ.get("PULSARTX_FUZZ_SCALE", "1")))
SCHEMA = pa.schema([("seq", pa.int64(), False), ("k", pa.string(), False), ("v", pa.int64())])
KEYS = st.sampled_from(["a", "b", "c"])
INSTANCES = 3
FAULTS = st.sampled_from([
    (Op.READ, Mode.ERROR, False), (Op.READ, Mode.ERROR, True),
    (Op.CREATE, Mode.ERROR, False), (Op.CREATE, Mode.LOST, False), (Op.CREATE, Mode.LOST, True),
    (Op.CREATE, Mode.HTTP500, False), (Op.WRITE, Mode.ERROR, False), (Op.DELTA, Mode.ERROR, False),
])
NTH = st.integers(1, 3)


def _fault(spec: tuple[Op, Mode, bool], nth: int, match: str) -> Fault:
    op, mode, transient = spec
    return Fault(op, mode, nth=nth, transient=transient, match=match, after=mode in (Mode.LOST, Mode.HTTP500))


class KeyedLogMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        faults.clear()
        self.dir = tempfile.mkdtemp(prefix="kl-model-")
        self.root = StorageRoot.resolve(self.dir)
        self.logs = [self._open() for _ in range(INSTANCES)]
        self.model: dict[str, int] = {}        # key -> value, as durable
        self.uncertain: dict[str, set[int | None]] = {}  # key -> values it may have after an unknown write
        self.written: dict[tuple[str, int], int] = {}    # (key, seq) -> value of a reported success
        self.seen_seq: dict[str, int] = {}

    def _open(self) -> KeyedLog:
        return KeyedLog(self.root, ("kl",), SCHEMA, key_of=lambda r: r["k"], name="kl", compact_every=4).open()

    def teardown(self) -> None:
        faults.clear()
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    @rule(spec=FAULTS, nth=NTH)
    def inject(self, spec, nth) -> None:
        faults.install([_fault(spec, nth, "kl")])

    @rule(i=st.integers(0, INSTANCES - 1), key=KEYS, value=st.integers(0, 1000), optimistic=st.booleans())
    def cas(self, i, key, value, optimistic) -> None:
        before = self.model.get(key)

        def change(cur):
            return {"k": key, "v": value}, (0 if cur is None else cur["seq"] + 1)

        try:
            seq = self.logs[i].cas(key, change, what=key, optimistic=optimistic, keep=lambda r: True)
        except PulsarException:
            self.uncertain.setdefault(key, {before}).add(value)
            return
        assert self.written.setdefault((key, seq), value) == value, f"two successes for {key} seq {seq}"
        self.model[key] = value
        self.uncertain.pop(key, None)

    @rule(i=st.integers(0, INSTANCES - 1))
    def refresh(self, i) -> None:
        with contextlib.suppress(PulsarException):  # a failed refresh leaves what is owed for later
            self.logs[i].refresh()

    @rule(i=st.integers(0, INSTANCES - 1))
    def compact(self, i) -> None:
        self.logs[i].compact(lambda r: True)  # never raises: an optimisation

    @rule(i=st.integers(0, INSTANCES - 1))
    def restart(self, i) -> None:
        """A process dies and another opens the log."""
        with contextlib.suppress(PulsarException):  # the old instance goes on
            self.logs[i] = self._open()

    @invariant()
    def storage_matches_the_model(self) -> None:
        if not hasattr(self, "root"):
            return
        pending = faults.plan()
        faults.clear()
        try:
            fresh = self._open()
            for key in ("a", "b", "c"):
                row = fresh.get(key)
                durable = None if row is None else row["v"]
                if key in self.uncertain:
                    assert durable in self.uncertain[key], (key, durable, self.uncertain[key])
                    if durable is not None:
                        self.model[key] = durable
                    self.uncertain.pop(key)
                else:
                    assert durable == self.model.get(key), (key, durable, self.model.get(key))
                if row is not None:
                    assert row["seq"] >= self.seen_seq.get(key, -1)
                    self.seen_seq[key] = row["seq"]
                    if (key, row["seq"]) in self.written:
                        assert self.written[(key, row["seq"])] == row["v"]
                for log in self.logs:
                    mine = log._rows.get(key)
                    assert mine is None or row is not None and mine["seq"] <= row["seq"], (key, mine, row)
        finally:
            faults.install(pending)

    @precondition(lambda self: hasattr(self, "root"))
    @rule()
    def all_agree_once_refreshed(self) -> None:
        faults.clear()
        views = []
        for log in self.logs:
            log.refresh()
            views.append({k: (r["seq"], r["v"]) for k, r in log.rows.items()})
        assert all(v == views[0] for v in views), views


class CoordinatorMachine(RuleBasedStateMachine):
    """Two coordinators of one TC log, racing commits, aborts and timeouts, with faults."""

    @initialize()
    def setup(self) -> None:
        faults.clear()
        self.dir = tempfile.mkdtemp(prefix="tc-model-")
        self.root = StorageRoot.resolve(self.dir)
        self.tcs = [self._tc() for _ in range(2)]
        self.txns: list = []
        self.reported: dict = {}  # txn -> set of outcomes reported to callers

    def _tc(self) -> TransactionCoordinator:
        cfg = CoordinatorConfig(recovery_grace_ms=0, compact_every=5, finished_retention_ms=10**9)
        return TransactionCoordinator(self.root, 0, cfg).open(recover=False)

    def teardown(self) -> None:
        faults.clear()
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    @rule(spec=FAULTS, nth=NTH)
    def inject(self, spec, nth) -> None:
        faults.install([_fault(spec, nth, "coordinator/tc-0/log")])

    @rule(i=st.integers(0, 1))
    def begin(self, i) -> None:
        try:
            meta = self.tcs[i].new_transaction(600_000, partitions=["persistent://public/default/m-partition-0"])
        except PulsarException:
            return
        self.txns.append(meta.txn_id)

    @precondition(lambda self: getattr(self, "txns", None))
    @rule(i=st.integers(0, 1), which=st.integers(0, 10**6), commit=st.booleans())
    def end(self, i, which, commit) -> None:
        t = self.txns[which % len(self.txns)]
        action = TxnAction.COMMIT if commit else TxnAction.ABORT
        try:
            meta = self.tcs[i].end_transaction(t, action, before_participants=lambda m: None)
        except PulsarException:
            return
        decided = "COMMIT" if meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED) else "ABORT"
        assert decided == ("COMMIT" if commit else "ABORT"), (t, action, meta.status)
        self.reported.setdefault(t, set()).add(decided)

    @rule(i=st.integers(0, 1))
    def restart(self, i) -> None:
        with contextlib.suppress(PulsarException):
            self.tcs[i] = self._tc()

    @invariant()
    def one_outcome_per_transaction(self) -> None:
        if not hasattr(self, "root"):
            return
        pending = faults.plan()
        faults.clear()
        try:
            fresh = self._tc()
            for t, outcomes in self.reported.items():
                assert len(outcomes) == 1, (t, outcomes)
                status = fresh.get(t).status
                durable = "COMMIT" if status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED) else (
                    "ABORT" if status in (TxnStatus.ABORTING, TxnStatus.ABORTED) else None)
                assert durable == next(iter(outcomes)), (t, outcomes, status)
        finally:
            faults.install(pending)


_SETTINGS = settings(max_examples=25 * SCALE, stateful_step_count=25, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestKeyedLogModel = KeyedLogMachine.TestCase
TestKeyedLogModel.settings = _SETTINGS
TestCoordinatorModel = CoordinatorMachine.TestCase
TestCoordinatorModel.settings = _SETTINGS
