"""A stateful model test (hypothesis) of transactions with an operator in the loop.

Beside a client that begins, sends, commits and aborts, an operator in another process's place
runs admin aborts at random moments (of open, deciding, decided and trimmed transactions) and the
TC log's maintenance trims finished transactions. After every step, two readers are checked
against a model of what READ_COMMITTED must show:
  * a client reader (one partition at a time, markers then the TC);
  * the consistent cut a Spark batch read plans with (every partition at one instant).
The model, per partition: the messages before the first message of a transaction still open,
minus those of transactions that did not commit (and, for the cut, minus those of transactions
with a message past some partition's limit: it never shows part of a transaction). An admin abort must tell the truth: it returns
ABORTED only for a transaction that then never commits, and refuses the others.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pulsartx
from pulsartx import MessageId
from pulsartx.buffer.buffer import TransactionBuffer
from pulsartx.buffer.reads import consistent_cut
from pulsartx.client.routing import partition_for_key
from pulsartx.coordinator.coordinator import CoordinatorConfig
from pulsartx.coordinator.registry import Coordinators
from pulsartx.coordinator.tclog import TransactionLog
from pulsartx.exceptions import InvalidTxnStatusError, PulsarException, TransactionNotFound
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName

PARTS = 2
TOPIC = "m"
# Finished transactions are trimmed by every full compaction of the TC log.
CFG = CoordinatorConfig(finished_retention_ms=0, compact_every=4, recovery_grace_ms=0)
COLUMNS = ["offset", "value", "txn_most_bits", "txn_least_bits", "type"]
MAX_TXNS = 4


def _key_for(partition: int) -> str:
    return next(f"k{i}" for i in range(1000) if partition_for_key(f"k{i}", PARTS) == partition)


KEYS = [_key_for(p) for p in range(PARTS)]


class OperatorMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="operator-model-")
        self.client = pulsartx.Client(self.dir, num_coordinators=1, coordinator_config=CFG)
        self.client.admin.create_topic(TOPIC, PARTS)
        self.producer = self.client.create_producer(TOPIC)
        self.admin = pulsartx.Client(self.dir, num_coordinators=1)  # the operator's own process
        self.txns: list = []
        self.status: list[str] = []  # per transaction: open, committed, aborted
        self.registered: list[bool] = []
        self.entries: dict[int, list[tuple[bytes, int | None]]] = {p: [] for p in range(PARTS)}
        self.n = 0

    def teardown(self) -> None:
        for c in ("client", "admin"):
            if hasattr(self, c):
                getattr(self, c).close()
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    # ---- the client ---------------------------------------------------------------------------
    @precondition(lambda self: len(self.txns) < MAX_TXNS)  # few, so operator actions hit each often
    @rule()
    def begin(self) -> None:
        self.txns.append(self.client.new_transaction())
        self.status.append("open")
        self.registered.append(False)

    @rule(part=st.integers(0, PARTS - 1))
    def send_plain(self, part) -> None:
        self._send(part, None)

    @precondition(lambda self: self.txns)
    @rule(which=st.integers(0, MAX_TXNS - 1), part=st.integers(0, PARTS - 1))
    def send_in_txn(self, which, part) -> None:
        self._send(part, which % len(self.txns))

    def _send(self, part: int, i: int | None) -> None:
        self.n += 1
        value = f"{self.n}:{'plain' if i is None else f't{i}'}".encode()
        txn = None if i is None else self.txns[i]
        try:
            mid = self.producer.send(value, partition_key=KEYS[part], txn=txn)
        except PulsarException:
            assert i is not None and self.status[i] != "open", (i, self.status[i])
            return
        assert i is None or self.status[i] == "open", (i, self.status[i])
        assert mid.partition() == part
        self.entries[part].append((value, i))
        if i is not None:
            self.registered[i] = True

    @precondition(lambda self: self.txns)
    @rule(which=st.integers(0, MAX_TXNS - 1), commit=st.booleans())
    def end(self, which, commit) -> None:
        i = which % len(self.txns)
        want = "committed" if commit else "aborted"
        try:
            self.txns[i].commit() if commit else self.txns[i].abort()
        except PulsarException:
            # Only a transaction already ended the other way (by its client or the operator) refuses.
            assert self.status[i] not in ("open", want), (i, self.status[i], want)
            return
        if self.status[i] == "open":
            self.status[i] = want
        assert self.status[i] == want, (i, self.status[i], want)

    # ---- the operator --------------------------------------------------------------------------
    @precondition(lambda self: self.txns)
    @rule(kind=st.sampled_from(["open", "deciding", "decided", "trimmed"]), which=st.integers(0, MAX_TXNS - 1),
          commit=st.booleans())
    def admin_abort(self, kind, which, commit) -> None:
        """An admin abort of a transaction in the ``kind`` state (any, when none is):
        * open: still OPEN, registered or not;
        * deciding: its client ends it (``commit``) and the abort follows at once, while the
          background completer writes its markers;
        * decided: ended, its markers and final entry written;
        * trimmed: ended, and the TC log's maintenance has just trimmed its entry."""
        ended = [j for j, st_ in enumerate(self.status) if st_ != "open"]
        opened = [j for j, st_ in enumerate(self.status) if st_ == "open"]
        pool = {"open": opened, "deciding": opened}.get(kind, ended) or list(range(len(self.txns)))
        i = pool[which % len(pool)]
        if kind == "deciding" and self.status[i] == "open":
            self.end(i, commit)
        elif kind == "decided":
            assert self.client.flush()
        elif kind == "trimmed":
            self.trim()
        try:
            meta = self.admin.admin.transactions.abort_transaction(str(self.txns[i].id))
        except (InvalidTxnStatusError, TransactionNotFound):
            # Refused: decided already, or not in the log and maybe finished (trimmed). An open
            # transaction is refused only when it registered nothing (its id may lie below one
            # that was trimmed); it holds nothing back.
            assert self.status[i] != "open" or not self.registered[i], (i, self.status[i])
            return
        assert meta["status"] in ("ABORTING", "ABORTED"), meta
        assert self.status[i] != "committed", f"admin abort reported {meta['status']} for committed {i} ({kind})"
        self.status[i] = "aborted"

    @rule()
    def trim(self) -> None:
        """The client's background completions done, the TC log's maintenance (any process's
        compaction) runs a full compaction, dropping every finished entry."""
        assert self.client.flush()
        for tc_id in sorted({t.id.most_bits for t in self.txns}):
            tl = TransactionLog(self.client.root, tc_id, compact_every=1, finished_retention_ms=0).open()
            tl.log.files_since_compaction = 1
            tl.maybe_compact(int(time.time() * 1000))

    # ---- the readers ---------------------------------------------------------------------------
    def _model(self, whole: bool) -> dict[int, list[bytes]]:
        """``whole``: the consistent cut's rule too, a transaction with any message at or past some
        partition's maxReadPosition is hidden in every partition (never part of one)."""
        limits = {p: next((j for j, (_, t) in enumerate(es) if t is not None and self.status[t] == "open"), len(es))
                  for p, es in self.entries.items()}
        cut = {t for p, es in self.entries.items() for _, t in es[limits[p]:] if t is not None} if whole else set()
        return {p: [v for v, t in es[:limits[p]] if t is None or (self.status[t] == "committed" and t not in cut)]
                for p, es in self.entries.items()}

    @invariant()
    def readers_match_the_model(self) -> None:
        if not hasattr(self, "client"):
            return
        by_reader: dict[int, list[bytes]] = {p: [] for p in range(PARTS)}
        with self.admin.create_reader(TOPIC, MessageId.earliest) as r:
            for m in r:
                by_reader[m.message_id().partition()].append(m.data())
        assert by_reader == self._model(whole=False)
        names = [str(TopicName.parse(f"{TOPIC}-partition-{p}")) for p in range(PARTS)]
        plogs = {n: PartitionLog(self.admin.root, TopicName.parse(n)) for n in names}
        filters = consistent_cut(Coordinators(self.admin.root, recover_on_open=False),
                                 {n: TransactionBuffer(pl) for n, pl in plogs.items()})
        by_cut = {}
        for p, n in enumerate(names):
            f = filters[n]
            rows = f.apply(plogs[n].read(0, f.read_limit, columns=COLUMNS)) if f.read_limit > 0 else None
            by_cut[p] = [] if rows is None else rows.column("value").to_pylist()
        assert by_cut == self._model(whole=True)


TestOperatorActions = OperatorMachine.TestCase
# 80 examples found the hole an admin abort of a trimmed transaction opened in about 3 runs of 4
# (30 examples: 1 in 2); PULSARTX_OPERATOR_EXAMPLES sets another count.
TestOperatorActions.settings = settings(
    max_examples=int(os.environ.get("PULSARTX_OPERATOR_EXAMPLES", "80")), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_owner_abort_after_an_operator_abort_that_compaction_trimmed():
    """Found by the model: the owner's abort() of a transaction an operator aborted, whose entry a
    later write's compaction then trimmed, raised TransactionNotFound. Only the owner commits, and
    it never asked to, so the forgotten transaction ended ABORTED and abort() returns quietly."""
    s = OperatorMachine()
    s.setup()
    try:
        s.begin()
        s.begin()
        s.send_in_txn(part=0, which=0)
        s.admin_abort(commit=False, kind="open", which=0)
        s.readers_match_the_model()
        s.end(commit=False, which=1)
        s.end(commit=False, which=0)
        s.readers_match_the_model()
        s.end(commit=True, which=0)  # refused: it was aborted
        assert s.status == ["aborted", "aborted"]
    finally:
        s.teardown()
