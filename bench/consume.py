"""Consume throughput: transactional acknowledgements against plain ones, and consume-transform-produce
against transactional produce.

    .venv/bin/python bench/consume.py [--chunks 60] [--chunk-size 1000] [--message-size 1024] [--profile]
                                      [--tables-only] [--table-size N]

Every side works on its own one-partition topic, pre-seeded (untimed) with ``chunks x chunk-size``
messages of ``message-size`` incompressible bytes, through an Exclusive subscription. One chunk is
one transaction where there are transactions:

  consume, plain acks       receive + acknowledge(msg) per message (grouped by the consumer,
                            acknowledgment_group_time_ms=100; the final flush at close is timed)
  consume, txn cumulative   receive the chunk, acknowledge_cumulative(last, txn), commit
  consume, txn ack list     receive the chunk, acknowledge(list_of_msgs, txn) (one write), commit
  consume, txn cum., async  as txn cumulative, but each commit() runs in a helper thread while the
                            next chunk is received (Pulsar's commit() returns a future); informative
  txn produce               send_async(value, txn) for the chunk, commit
  consume-transform-produce receive, send_async(transform(value), txn) per message,
                            acknowledge_cumulative(last, txn), commit
  plain c-t-p               the same without a transaction: send_async(transform(value)) per message,
                            acknowledge_cumulative(last) (grouped), flush() per chunk
  tables c-t-p              receive_table, the transform in pyarrow.compute, send_table(txn),
                            acknowledge_table(txn), commit: one transaction per table, of chunk-size
                            rows (the per-message side's transaction size), and on a second side of
                            --table-size rows (default 10 chunks: a table loop's gain grows with its
                            table, as the transaction's fixed storage work is shared by more rows)

The sides take turns of 10 chunks (back to back, as an application runs them), in a rotating order,
so that load from other processes on a shared machine hits all of them alike; each turn ends with
the side's ``client.flush()``, timed, so the background completion of its transactions is charged
to it. Ratios (wall time; process CPU time alongside):
  txn cumulative / plain  (target >= 0.8)      txn ack list, async commit / plain  (reported)
  consume-transform-produce / txn produce  (target >= 0.8)
  consume-transform-produce / plain c-t-p  (reported: what transactions cost a c-t-p loop)
  c-t-p ceiling  (reported: the most c-t-p / txn produce can reach when a c-t-p loop costs no
                  more than producing its output transactionally plus consuming its input with
                  plain acks, i.e. when the transactional acknowledgement is free:
                  txn produce time / (txn produce time + plain acks time))
  tables c-t-p / consume-transform-produce  (target >= 3), for each tables side: the median of the
                  per-round ratios (a round is one turn of every side), with their spread (min-max)
Nothing is asserted; every side's end state is checked (all consumed, nothing pending, outputs
all there) so that a fast but wrong side cannot pass. ``--profile`` adds cProfiles.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

TARGET_CONSUME = 0.8
TARGET_CTP = 0.8
TARGET_TABLES = 3.0
RECEIVE_TIMEOUT_MS = 30_000
TURN = 10  # chunks a side runs back to back before the next side's turn


def make_payloads(chunks: int, chunk_size: int, message_size: int, seed: int = 7) -> list[list[bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(chunks):
        blob = rng.bytes(chunk_size * message_size)
        out.append([blob[i * message_size:(i + 1) * message_size] for i in range(chunk_size)])
    return out


class Side:
    topic = "bench"
    sub = "bench-sub"

    def __init__(self, name: str, workdir: str, profile: bool):
        from pulsartx import Client

        self.name = name
        self.client = Client(workdir)
        self.client.admin.create_topic(self.topic, partitions=1)
        for tc in self.client._coordinators().all():  # open (create) every TC log before the clock starts
            tc.transactions()
        self.wall = 0.0
        self.cpu = 0.0
        self.messages = 0
        self.turns: list[tuple[float, float, int]] = []  # (wall, cpu, messages) of each turn
        self.prof = cProfile.Profile() if profile else None

    def seed(self, payloads: list[list[bytes]]) -> None:
        p = self.client.create_producer(self.topic, batching_max_messages=len(payloads[0]))
        for chunk in payloads:
            for v in chunk:
                p.send_async(v, None)
            p.flush()
        p.close()

    def subscribe(self):
        from pulsartx import ConsumerType, InitialPosition

        return self.client.subscribe(self.topic, self.sub, consumer_type=ConsumerType.Exclusive,
                                     initial_position=InitialPosition.Earliest)

    def timed(self, fn, *args) -> None:
        if self.prof:
            self.prof.enable()
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            fn(*args)
        finally:
            self.wall += time.perf_counter() - w0
            self.cpu += time.process_time() - c0
            if self.prof:
                self.prof.disable()

    def chunk(self, i: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def check(self, expected: int) -> None:
        pass

    def rate(self) -> float:
        return self.messages / self.wall if self.wall else 0.0

    def mark_turn(self, wall0: float, cpu0: float, messages0: int) -> None:
        self.turns.append((self.wall - wall0, self.cpu - cpu0, self.messages - messages0))

    def profile_report(self, n: int = 25) -> str:
        if not self.prof:
            return ""
        s = io.StringIO()
        pstats.Stats(self.prof, stream=s).sort_stats("cumulative").print_stats(n)
        return s.getvalue()

    def check_subscription_at_end(self, expected: int) -> None:
        from pulsartx import Timeout

        [st] = self.client.admin.transactions.get_pending_ack_stats(self.topic, self.sub)
        if st["markDeletePosition"] != expected - 1 or st["pendingAckCount"] or st["individuallyAckedRanges"]:
            raise RuntimeError(f"{self.name}: subscription not at the end: {st}")
        c = self.subscribe()
        try:
            m = c.receive(timeout_millis=300)
            raise RuntimeError(f"{self.name}: {m.message_id()} delivered again after everything was acked")
        except Timeout:
            pass
        c.close()


class ConsumeSide(Side):
    def __init__(self, name: str, workdir: str, payloads, mode: str, profile: bool):
        super().__init__(name, workdir, profile)
        self.seed(payloads)
        self.mode = mode
        self.n = len(payloads[0])
        self.consumer = self.subscribe()
        self.pool = ThreadPoolExecutor(1) if mode == "txn-pipelined" else None
        self.inflight = None

    def chunk(self, i: int) -> None:
        c, n = self.consumer, self.n
        receive = c.receive
        if self.mode == "plain":
            ack = c.acknowledge
            for _ in range(n):
                ack(receive(RECEIVE_TIMEOUT_MS))
        elif self.pool is None:
            txn = self.client.new_transaction()
            msgs = [receive(RECEIVE_TIMEOUT_MS) for _ in range(n)]
            if self.mode == "txn-list":
                c.acknowledge(msgs, txn=txn)
            else:
                c.acknowledge_cumulative(msgs[-1], txn=txn)
            txn.commit()
        else:
            # Pulsar's commit() returns a future: the previous chunk's commit runs in a helper thread
            # while this chunk is received. It must end before this chunk's cumulative ack (another
            # transaction's pending cumulative ack would conflict), and nothing is left running when
            # this call returns, so no work escapes the timing into the other sides' turns.
            prev = self.pool.submit(self.inflight.commit) if self.inflight is not None else None
            txn = self.client.new_transaction()
            msgs = [receive(RECEIVE_TIMEOUT_MS) for _ in range(n)]
            if prev is not None:
                prev.result()
            c.acknowledge_cumulative(msgs[-1], txn=txn)
            self.inflight = txn
        self.messages += n

    def finish(self) -> None:
        if self.inflight is not None:
            self.timed(self.inflight.commit)
        self.timed(self.consumer.close)  # the plain side's last grouped acks land here

    def check(self, expected: int) -> None:
        self.check_subscription_at_end(expected)


class TxnProduceSide(Side):
    def __init__(self, name: str, workdir: str, payloads, profile: bool):
        super().__init__(name, workdir, profile)
        self.payloads = payloads
        self.producer = self.client.create_producer(self.topic, batching_max_messages=len(payloads[0]))

    def chunk(self, i: int) -> None:
        txn = self.client.new_transaction()
        send = self.producer.send_async
        for v in self.payloads[i]:
            send(v, None, txn=txn)
        txn.commit()
        self.messages += len(self.payloads[i])

    def check(self, expected: int) -> None:
        self.producer.close()
        got = count_committed(self.client, self.topic)
        if got != expected:
            raise RuntimeError(f"{self.name}: {got} committed messages, expected {expected}")


def transform(value: bytes) -> bytes:
    """A cheap, real transformation: a header plus the payload (one copy, as a map step would do)."""
    return b"T:" + value


class CtpSide(Side):
    out = "bench-out"

    def __init__(self, name: str, workdir: str, payloads, profile: bool, transactional: bool = True):
        super().__init__(name, workdir, profile)
        self.transactional = transactional
        self.seed(payloads)
        self.n = len(payloads[0])
        self.client.admin.create_topic(self.out, partitions=1)
        self.producer = self.client.create_producer(self.out, batching_max_messages=self.n)
        self.consumer = self.subscribe()

    def chunk(self, i: int) -> None:
        c, send, receive = self.consumer, self.producer.send_async, self.consumer.receive
        txn = self.client.new_transaction() if self.transactional else None
        m = None
        for _ in range(self.n):
            m = receive(RECEIVE_TIMEOUT_MS)
            send(transform(m.data()), None, txn=txn)
        c.acknowledge_cumulative(m, txn=txn)
        if txn is not None:
            txn.commit()
        else:
            self.producer.flush()
        self.messages += self.n

    def finish(self) -> None:
        self.timed(self.consumer.close)

    def check(self, expected: int) -> None:
        self.check_subscription_at_end(expected)
        self.producer.close()
        got = count_committed(self.client, self.out)
        if got != expected:
            raise RuntimeError(f"{self.name}: {got} committed outputs, expected {expected}")


def add_header(values):
    """The per-message side's transform, on a column: b"T:" + value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(pa.scalar(b"T:"), values, pa.scalar(b""))


class TablesCtpSide(CtpSide):
    """Consume-transform-produce over Arrow tables, one transaction per table. A table holds
    ``per_table`` chunks' messages: it is taken on every ``per_table``-th chunk, so the side still
    works through the same messages in the same turns as the others."""

    def __init__(self, name: str, workdir: str, payloads, profile: bool, per_table: int = 1):
        super().__init__(name, workdir, payloads, profile)
        self.per_table = per_table
        if per_table > 1:  # a table is one append, as a chunk is on the per-message side
            self.producer.close()
            self.producer = self.client.create_producer(self.out, batching_max_messages=self.n * per_table)

    def chunk(self, i: int) -> None:
        import pyarrow as pa

        if (i + 1) % self.per_table:
            return
        c = self.consumer
        table = c.receive_table(max_messages=self.n * self.per_table, timeout_millis=RECEIVE_TIMEOUT_MS)
        txn = self.client.new_transaction()
        self.producer.send_table(pa.table({"value": add_header(table.column("value"))}), txn=txn)
        c.acknowledge_table(table, txn=txn)
        txn.commit()
        self.messages += table.num_rows


def count_committed(client, topic: str) -> int:
    from pulsartx import MessageId, Timeout

    r = client.create_reader(topic, MessageId.earliest)
    n = 0
    while True:
        try:
            r.read_next(timeout_millis=300)
        except Timeout:
            break
        n += 1
    r.close()
    return n


def run(sides: list[Side], chunks: int, turn: int = TURN) -> None:
    """Sides take turns of ``turn`` chunks, in a rotating order, and each turn ends with the side's
    ``client.flush()`` inside its timing: a side's transactions complete in the background (markers,
    acknowledgement commits, final records, folded into its next transaction's commits when it runs
    back to back), and that work must be charged to it, not to the side that runs next."""
    for n, start in enumerate(range(0, chunks, turn)):
        for k in range(len(sides)):
            s = sides[(n + k) % len(sides)]
            w0, c0, m0 = s.wall, s.cpu, s.messages
            for i in range(start, min(chunks, start + turn)):
                s.timed(s.chunk, i)
            s.timed(s.client.flush)
            s.mark_turn(w0, c0, m0)
    for s in sides:
        s.finish()


def print_round_ratio(label: str, a: Side, b: Side, target: float) -> None:
    """``a``'s throughput over ``b``'s, per round (one turn each, the sides interleaved): the median
    and the spread of the rounds, so that load from elsewhere during one round shows as spread."""
    rounds = [(ma / wa) / (mb / wb) for (wa, _, ma), (wb, _, mb) in zip(a.turns, b.turns, strict=True) if wa and wb]
    cpu = [(cb / mb) / (ca / ma) for (_, ca, ma), (_, cb, mb) in zip(a.turns, b.turns, strict=True)
           if ca and ma and mb]
    if not rounds:
        return
    med = statistics.median(rounds)
    flag = "ok" if med >= target else "BELOW TARGET"
    print(f"{label:42s} {med:6.2f} {statistics.median(cpu):6.2f} {'>= ' + str(target):>7s}  {flag}  "
          f"(median of {len(rounds)} rounds, spread {min(rounds):.2f}-{max(rounds):.2f}"
          f"{'; at least 5 rounds are needed to judge' if len(rounds) < 5 else ''})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=60, help="transactions (chunks) per side")
    ap.add_argument("--chunk-size", type=int, default=1000, help="messages per chunk / transaction")
    ap.add_argument("--message-size", type=int, default=1024, help="payload bytes per message")
    ap.add_argument("--dir", default=None, help="work directory (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--profile", action="store_true", help="cProfile every side (cumulative, top functions)")
    ap.add_argument("--tables-only", action="store_true",
                    help="run only the two consume-transform-produce sides the tables ratio compares")
    ap.add_argument("--table-size", type=int, default=None,
                    help="rows per table (one transaction each) on the second tables side: the chunk size "
                         "times 2, 5 or 10 (default 10), or the chunk size to run only the equal-size side")
    args = ap.parse_args(argv)
    table_size = args.table_size or TURN * args.chunk_size
    per_table = table_size // args.chunk_size
    if table_size % args.chunk_size or TURN % per_table or args.chunks % per_table:
        ap.error(f"--table-size {table_size}: must be the chunk size ({args.chunk_size}) times 1, 2, 5 or 10, "
                 f"dividing --chunks ({args.chunks})")

    n = args.chunks * args.chunk_size
    try:
        load = f" load avg {os.getloadavg()[0]:.1f},"
    except OSError:
        load = ""
    print(f"consume bench: {args.chunks} chunks x {args.chunk_size} messages x {args.message_size} B = {n:,} "
          f"messages per side; {os.cpu_count()} CPU(s),{load} sides in turns of {TURN} chunks")
    payloads = make_payloads(args.chunks, args.chunk_size, args.message_size)
    base = args.dir or tempfile.mkdtemp(prefix="pulsartx-bench-consume-")
    t0 = time.perf_counter()
    try:
        d = lambda name: os.path.join(base, name)  # noqa: E731
        prof = args.profile
        ctp = CtpSide("consume-transform-produce", d("ctp"), payloads, prof)
        tables = [TablesCtpSide(f"tables c-t-p ({args.chunk_size}/table)", d("tables"), payloads, prof)]
        if per_table > 1:
            tables.append(TablesCtpSide(f"tables c-t-p ({table_size}/table)", d("big-tables"), payloads, prof,
                                        per_table))
        sides: list[Side] = [ctp, *tables]
        if not args.tables_only:
            plain = ConsumeSide("consume, plain acks", d("plain"), payloads, "plain", prof)
            cum = ConsumeSide("consume, txn cumulative ack", d("cum"), payloads, "txn-cumulative", prof)
            lst = ConsumeSide("consume, txn ack list", d("list"), payloads, "txn-list", prof)
            pipe = ConsumeSide("consume, txn cum., async commit", d("pipe"), payloads, "txn-pipelined", prof)
            produce = TxnProduceSide("txn produce (send_async)", d("produce"), payloads, prof)
            plain_ctp = CtpSide("plain c-t-p (no transaction)", d("plain-ctp"), payloads, prof, transactional=False)
            sides = [plain, cum, lst, pipe, produce, ctp, plain_ctp, *tables]
        os.sync()  # the seeding's write-back must not land in the timed phase (it slows every file create)
        print(f"seeded {(len(sides) - 1) * n:,} messages in {time.perf_counter() - t0:.1f} s (untimed)")
        run(sides, args.chunks)
        for s in sides:
            s.check(n)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    print()
    print(f"{'side':32s} {'wall s':>8s} {'msg/s':>10s} {'MB/s':>7s} {'cpu s':>7s}")
    for s in sides:
        print(f"{s.name:32s} {s.wall:8.2f} {s.rate():10,.0f} {s.rate() * args.message_size / 1e6:7.1f} {s.cpu:7.2f}")
    rows = [] if args.tables_only else [
        ("txn cumulative ack / plain acks", cum, plain, TARGET_CONSUME),
        ("txn ack list / plain acks", lst, plain, TARGET_CONSUME),
        ("txn cumulative, async commit / plain acks", pipe, plain, TARGET_CONSUME),
        ("consume-transform-produce / txn produce", ctp, produce, TARGET_CTP),
        ("consume-transform-produce / plain c-t-p", ctp, plain_ctp, None),
    ]
    print()
    print(f"{'ratio (throughput)':42s} {'wall':>6s} {'cpu':>6s} {'target':>7s}")
    for label, a, b, target in rows:
        ratio = a.rate() / b.rate()
        cpu_ratio = b.cpu / a.cpu
        if target is None:
            print(f"{label:42s} {ratio:6.2f} {cpu_ratio:6.2f} {'report':>7s}")
            continue
        flag = "ok" if ratio >= target else "BELOW TARGET"
        print(f"{label:42s} {ratio:6.2f} {cpu_ratio:6.2f} {'>= ' + str(target):>7s}  {flag}")
    if not args.tables_only:
        ceiling = produce.wall / (produce.wall + plain.wall)
        cpu_ceiling = produce.cpu / (produce.cpu + plain.cpu)
        print(f"{'c-t-p ceiling (free transactional ack)':42s} {ceiling:6.2f} {cpu_ceiling:6.2f} {'report':>7s}")
    for side in tables:
        rows = side.n * side.per_table
        print_round_ratio(f"tables c-t-p, {rows}-row tables / c-t-p", side, ctp, TARGET_TABLES)
        print(f"  (a transaction per table of {rows} rows, against one per {args.chunk_size} messages"
              f"{': the same transaction size' if side.per_table == 1 else ''})")
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")
    if args.profile:
        for s in sides:
            print(f"\n==== cProfile: {s.name} ====")
            print(s.profile_report())
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    from common import exit_with

    exit_with(main)
