"""``make demo``: examples/quickstart.py shows what pulsartx is for, on a fresh root, run as the
Makefile runs it, and again on the same root; and the demo installs only the runtime."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from _fresh import REPO, fresh_checkout, run

from pulsartx import Client, MessageId, Timeout

LOG4J2 = REPO / "conf" / "log4j2.properties"

# The screen a user sees, line by line; `TXN` stands for a TxnID such as (2,0).
EXPECTED = """\
1. One transaction across two topics, committed; another aborted
committed txn TXN: orders 1 and 2 to demo-orders, a payment to demo-payments
aborted   txn TXN: order 3 to demo-orders, a payment to demo-payments

2. Spark reads both topics READ_COMMITTED: exactly the committed messages
   demo-orders    {"order": 1, "customer": "alice", "amount": 30}
   demo-orders    {"order": 2, "customer": "bob", "amount": 12}
   demo-payments  {"order": 1, "paid": 30}
   (READ_UNCOMMITTED shows 5: the aborted transaction's 2 as well)

3. Consume-transform-produce: demo-orders -> demo-invoices, exactly once
   demo-invoices  {"order":1,"customer":"alice","gross":36.0}
   demo-invoices  {"order":2,"customer":"bob","gross":14.4}
   each micro-batch wrote its invoices and acknowledged its orders on subscription 'invoicing' in one transaction

4. Look at it next
   .venv/bin/pulsartx --service-url ./pulsartx-data topics list
   .venv/bin/pulsartx --service-url ./pulsartx-data topics stats demo-orders
   .venv/bin/pulsartx --service-url ./pulsartx-data topics peek demo-invoices
   .venv/bin/pulsartx --service-url ./pulsartx-data subscriptions list demo-orders
   .venv/bin/pulsartx --service-url ./pulsartx-data transactions coordinator-stats

quickstart OK
"""


def _demo(cwd: Path) -> list[str]:
    """The Makefile's SPARK_SUBMIT line and exports, from a checkout's directory."""
    python = str(cwd / ".venv" / "bin" / "python")
    done = run([str(cwd / ".venv" / "bin" / "spark-submit"), "--properties-file", "conf/spark-defaults.conf",
                "--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J2}", "examples/quickstart.py"],
               cwd, timeout=300, env={"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python})
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"storage root /\S+/pulsartx-data, run [0-9a-f]{8}", lines[0]), lines[0]
    assert lines[1] == ""
    return [re.sub(r"\(\d+,\d+\)", "TXN", line) for line in lines[2:]]


def _count(client: Client, topic: str) -> int:
    reader, n = client.create_reader(topic, MessageId.earliest), 0
    while True:
        try:
            reader.read_next(timeout_millis=200)
            n += 1
        except Timeout:
            reader.close()
            return n


def test_the_demo_shows_transactions_isolation_and_exactly_once_twice(tmp_path):
    if shutil.which("java") is None:
        pytest.skip("Java is needed for Spark (README: Requirements)")
    cwd = fresh_checkout(tmp_path / "checkout")
    for _ in range(2):  # `make demo` again on the same root shows the same screen
        assert _demo(cwd) == EXPECTED.splitlines()
    # The CLI commands it prints work as printed.
    for line in EXPECTED.splitlines():
        if line.startswith("   .venv/bin/pulsartx"):
            assert run(["bash", "-c", line.strip()], cwd, timeout=120).stdout
    with Client(str(cwd / "pulsartx-data")) as client:
        # Each run's two committed orders became one invoice each, once: the subscription resumed.
        assert _count(client, "demo-invoices") == 4
        assert client.admin.list_subscriptions("demo-orders") == ["invoicing"]


def test_make_demo_installs_only_the_runtime_with_progress(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"  # a venv that does not exist: make prints the whole install, runs nothing
    plan = subprocess.run(["make", "-n", "demo", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line]
    assert installs and all("--progress-bar on" in line for line in installs), plan
    assert not any("[dev]" in line or ".[" in line for line in installs), installs
    assert any(re.search(r"pip install --progress-bar on -e \.(\s|$)", line) for line in installs), installs
    assert "examples/quickstart.py" in plan and "log4j2.configurationFile" in plan
