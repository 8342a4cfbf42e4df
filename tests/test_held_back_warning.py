"""A READ_COMMITTED Spark read that an open transaction holds back logs one WARN line naming
the transaction (TxnID, owner, age against its timeout) and the partitions it holds."""
from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

from _fresh import user_env
from pulsartx.datasource.visibility import plan_visibility

import pulsartx
from pulsartx.log.partition import PartitionLog
from pulsartx.naming import TopicName
from pulsartx.storage.root import StorageRoot

PROJECT = Path(__file__).resolve().parents[1]
LOGGER = "pulsartx.datasource"


def hold(root: str) -> tuple[pulsartx.Client, object]:
    """held-partition-0: a o0 b, held-partition-1: o1 c (o* in one open transaction of owner etl),
    calm-partition-0: d."""
    c = pulsartx.Client(root, num_coordinators=1)
    c.admin.create_topic("held", partitions=2)
    c.admin.create_topic("calm")
    etl = pulsartx.Client(root, transaction_key="loader", owner="etl", num_coordinators=1)
    t = etl.new_transaction(timeout_ms=600_000)
    p0, p1 = c.create_producer("held-partition-0"), c.create_producer("held-partition-1")
    p0.send(b"a")
    etl.create_producer("held-partition-0").send(b"o0", txn=t)
    etl.create_producer("held-partition-1").send(b"o1", txn=t)
    p0.send(b"b")
    p1.send(b"c")
    c.create_producer("calm").send(b"d")
    return c, t


def plan(root: str, *partitions: str) -> dict:
    r = StorageRoot.resolve(root)
    return plan_visibility(r, {p: PartitionLog(r, TopicName.parse(p)) for p in partitions}, "READ_COMMITTED")


def test_one_warning_names_the_transaction_and_its_partitions(tmp_path, caplog) -> None:
    root = str(tmp_path / "root")
    c, t = hold(root)
    parts = [str(TopicName.parse(n)) for n in ("held-partition-0", "held-partition-1", "calm-partition-0")]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        planned = plan(root, *parts)
    assert [planned[p].read_limit for p in parts] == [1, 0, 1]
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelname for r in records] == ["WARNING"]
    msg = records[0].getMessage()
    pattern = (rf"READ_COMMITTED read held back by open transaction \(0,\d+\) \(owner 'etl', transaction key "
               r"'loader'; OPEN, open (\d+\.\d) s of its 600 s timeout\): it holds maxReadPosition of "
               rf"{re.escape(parts[0])} at 0 \(2 entries after it\), {re.escape(parts[1])} at -1 \(2 entries after "
               r"it\); the read returns only what is before it\. Wait for it to commit, abort or time out, or "
               rf"abort it with `pulsartx --service-url {re.escape(root)} transactions abort 0:{t.id.least_bits}` "
               r"if its owner is gone")
    m = re.fullmatch(pattern, msg)
    assert m, msg
    assert str(t.id) in msg and float(m.group(1)) < 600
    c.close()


def fix_command(caplog) -> list[str]:
    """The command the one held-back warning prints, as a shell would split it."""
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    return shlex.split(re.search(r"`(pulsartx [^`]*)`", record.getMessage()).group(1))


def test_the_printed_abort_acts_on_its_root_from_any_directory(tmp_path, caplog) -> None:
    """Run where another root answers to the default ``./pulsartx-data``, and holds a transaction
    with the same TxnID, the printed command still aborts the one the warning is about."""
    root = str(tmp_path / "held root")  # a space: the printed root must come out quoted
    c, t = hold(root)
    elsewhere = tmp_path / "elsewhere"
    other, twin = hold(str(elsewhere / "pulsartx-data"))
    assert twin.id == t.id
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        plan(root, str(TopicName.parse("held-partition-0")))
    argv = fix_command(caplog)
    done = subprocess.run([str(Path(sys.executable).parent / "pulsartx"), *argv[1:]], cwd=elsewhere, env=user_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status = lambda client, txn: client._coordinators().for_txn(txn.id).get(txn.id, refresh=True).status.value  # noqa: E731
    assert (status(c, t), status(other, twin)) == ("ABORTED", "OPEN")
    assert argv == ["pulsartx", "--service-url", root, "transactions", "abort", f"0:{t.id.least_bits}"]
    c.close()
    other.close()


def test_no_warning_when_nothing_is_held(tmp_path, caplog) -> None:
    root = str(tmp_path / "root")
    c, t = hold(root)
    t.commit()
    c.flush()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        plan(root, str(TopicName.parse("held-partition-0")), str(TopicName.parse("calm-partition-0")))
    assert [r for r in caplog.records if r.name == LOGGER] == []
    c.close()


def test_spark_read_logs_it_once(tmp_path) -> None:
    """Through Spark: the read is planned in a pyspark worker process, whose log goes to the
    driver's stderr. A job of its own, so its stderr can be read whole."""
    root = str(tmp_path / "root")
    c, t = hold(root)
    c.close()
    job = tmp_path / "read.py"
    job.write_text(textwrap.dedent(f"""
        import os, sys
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.extraJavaOptions",
                         "-Dlog4j2.configurationFile=file:{PROJECT / 'conf' / 'log4j2.properties'}").getOrCreate())
        rows = spark.read.format("pulsartx").option("service.url", {root!r}).option("topic", "held").load().collect()
        print("ROWS", sorted(r.value.decode() for r in rows), flush=True)
        spark.stop()
        os._exit(0)
    """))
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    done = subprocess.run([sys.executable, str(job)], capture_output=True, text=True, timeout=300, env=env)
    assert "ROWS ['a']" in done.stdout, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "READ_COMMITTED read held back" in line]
    assert len(warnings) == 1, done.stderr[-3000:]
    assert f"open transaction {t.id} (owner 'etl', transaction key 'loader'; OPEN" in warnings[0]
