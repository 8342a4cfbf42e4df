"""CPU and wall time per S3 request of pulsartx's own request mix, s3fs/botocore against obstore
(Rust's object_store, the engine delta-rs uses), on a throw-away Ceph RGW (tests/reliability/rgw.py).
Prints figures; asserts nothing.

    .venv/bin/python bench/s3_requests.py [--rounds 7] [--n 40] [--endpoint URL]

The mix is what StorageRoot sends itself: a GET of a small object (a Delta commit), a HEAD
(``has_file``: the idle reader's probe), ``exists`` (s3fs: a HEAD, then a listing for a missing key),
a listing of a prefix holding 100 keys, a PUT (a data file or a JSON document), and a conditional
PUT (``If-None-Match: *``: the Delta commit) that succeeds and one that fails with 412.

Each round runs every request kind ``--n`` times through each client, alternating which client goes
first, so both see the same machine load; per request, the CPU (``time.process_time``: all threads
of this process, the Rust runtime's and s3fs's event-loop thread included) and the wall time. The
Ceph daemons' CPU is not this process's and is not counted. Printed: per kind, the median over
rounds and the spread (min-max), and the ratio s3fs / obstore.

s3fs is called as StorageRoot called it before obstore (``cat_file``, ``call_s3("head_object")``,
``exists``, ``ls``, ``pipe`` with ``mode="create"``); obstore as StorageRoot calls it now.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = b'{"commitInfo":{"timestamp":1,"operation":"WRITE"}}\n' * 20  # ~1 KB, a small commit
LIST_KEYS = 100


def s3fs_client(options: dict[str, str]) -> Any:
    import fsspec

    from pulsartx.storage.root import StorageRoot

    return fsspec.filesystem("s3", **StorageRoot("s3://x", options).s3fs_kwargs())


def s3fs_ops(fs: Any, bucket: str) -> dict[str, Callable[[int], Any]]:
    run = uuid.uuid4().hex[:8]

    def create_ok(i: int) -> None:
        fs.pipe(f"{bucket}/s3fs/{run}/c-{i}-{uuid.uuid4().hex[:6]}", BODY, mode="create")

    def create_fail(i: int) -> None:
        try:
            fs.pipe(f"{bucket}/fixed/small", BODY, mode="create")
        except (FileExistsError, OSError):
            return
        raise AssertionError("conditional put over an existing key succeeded")

    def head(i: int) -> None:
        fs.call_s3("head_object", fs.kwargs, Bucket=bucket, Key="fixed/small")

    return {
        "get": lambda i: fs.cat_file(f"{bucket}/fixed/small"),
        "head": head,
        "exists (missing key)": lambda i: fs.exists(f"{bucket}/fixed/missing-{i}"),
        f"list {LIST_KEYS} keys": lambda i: fs.ls(f"{bucket}/listed", detail=False),
        "put": lambda i: fs.pipe(f"{bucket}/s3fs/{run}/p-{i}", BODY),
        "create (wins)": create_ok,
        "create (412)": create_fail,
    }


def obstore_ops(options: dict[str, str], bucket: str) -> dict[str, Callable[[int], Any]]:
    from pulsartx.storage.objstore import Bucket

    b = Bucket(bucket, options)
    run = uuid.uuid4().hex[:8]

    def create_fail(i: int) -> None:
        if b.create("fixed/small", BODY):
            raise AssertionError("conditional put over an existing key succeeded")

    return {
        "get": lambda i: b.get("fixed/small"),
        "head": lambda i: b.head("fixed/small"),
        "exists (missing key)": lambda i: b.exists(f"fixed/missing-{i}"),
        f"list {LIST_KEYS} keys": lambda i: b.children("listed"),
        "put": lambda i: b.put(f"obstore/{run}/p-{i}", BODY),
        "create (wins)": lambda i: b.create(f"obstore/{run}/c-{i}-{uuid.uuid4().hex[:6]}", BODY),
        "create (412)": create_fail,
    }


def timed(fn: Callable[[int], Any], n: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call, over ``n`` calls."""
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.process_time() - c0) / n, (time.perf_counter() - w0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=40, help="requests of each kind per client per round")
    ap.add_argument("--endpoint", default=None, help="an S3 endpoint already running (default: start an RGW)")
    args = ap.parse_args()
    sys.path.insert(0, REPO)
    server = None
    if args.endpoint:
        options = {"AWS_ENDPOINT_URL": args.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                   "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        import boto3

        bucket = f"s3req-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=args.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
    else:
        from tests.reliability import rgw

        server = rgw.start()
        options = server.storage_options
        bucket = server.new_bucket("s3req")
    try:
        s3 = server.s3_client() if server else None
        if s3 is not None:
            s3.put_object(Bucket=bucket, Key="fixed/small", Body=BODY)
            for k in range(LIST_KEYS):
                s3.put_object(Bucket=bucket, Key=f"listed/{k:020d}.json", Body=b"{}")
        clients = {"s3fs": s3fs_ops(s3fs_client(options), bucket), "obstore": obstore_ops(options, bucket)}
        for ops in clients.values():  # warm up: connections, credentials, imports
            for fn in ops.values():
                timed(fn, 3)
        kinds = list(clients["s3fs"])
        cpu: dict[tuple[str, str], list[float]] = {}
        wall: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            order = list(clients) if r % 2 == 0 else list(reversed(clients))
            for kind in kinds:
                for name in order:
                    c, w = timed(clients[name][kind], args.n)
                    cpu.setdefault((name, kind), []).append(c)
                    wall.setdefault((name, kind), []).append(w)
        print(f"S3 requests on Ceph RGW, {args.rounds} interleaved rounds x {args.n} requests per kind and client; "
              f"ms per request, median [min-max] over rounds; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        print(f"{'request':<22}{'CPU s3fs':>22}{'CPU obstore':>22}{'ratio':>7}{'wall s3fs':>22}{'wall obstore':>22}")

        def fmt(xs: list[float]) -> str:
            return f"{1000 * statistics.median(xs):.2f} [{1000 * min(xs):.2f}-{1000 * max(xs):.2f}]"

        for kind in kinds:
            a, b = cpu[("s3fs", kind)], cpu[("obstore", kind)]
            print(f"{kind:<22}{fmt(a):>22}{fmt(b):>22}{statistics.median(a) / statistics.median(b):>7.1f}"
                  f"{fmt(wall[('s3fs', kind)]):>22}{fmt(wall[('obstore', kind)]):>22}")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
