"""conf/grafana-dashboard.json: a Grafana dashboard whose every query asks for metrics pulsartx
exports. Each PromQL expression is parsed (promql-parser, Prometheus' grammar) and its metric names
and labels are checked against what ``pulsartx.metrics`` exports after a workload that makes every
family carry samples."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pulsartx
from pulsartx import InitialPosition
from pulsartx.metrics import generate_latest, reset

DASHBOARD = Path(__file__).resolve().parents[1] / "conf" / "grafana-dashboard.json"
# Grafana's own variables, replaced as Grafana would before Prometheus sees the query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "6h"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Metric name -> its label names, as scraped after commits, an abort, a transactional ack,
    a transaction key and an open transaction."""
    reset()
    root = str(tmp_path_factory.mktemp("metrics-root"))
    with pulsartx.Client(root, num_coordinators=2) as c:
        c.admin.create_topic("m", partitions=2)
        p = c.create_producer("m")
        with c.new_transaction() as t:
            p.send(b"c", txn=t)
        t = c.new_transaction()
        p.send(b"a", txn=t)
        t.abort()
        consumer = c.subscribe("m", "s", initial_position=InitialPosition.Earliest)
        msg = consumer.receive(5000)
        with c.new_transaction() as t:
            consumer.acknowledge(msg, txn=t)
        open_txn = c.new_transaction(timeout_ms=600_000)
        p.send(b"o", txn=open_txn)
        with pulsartx.Client(root, transaction_key="k", owner="o", num_coordinators=2):
            pass
        c.flush()
        text = generate_latest(c)
        consumer.close()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))
    return out


def selectors(node: Any) -> list[Any]:
    """Every VectorSelector under a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node]
    children = []
    for attr in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, str | int | float):
            children.append(child)
    children.extend(getattr(node, "args", None) or [])
    return [s for c in children for s in selectors(c)]


def grouping_labels(node: Any) -> list[tuple[list[str], list[Any]]]:
    """(labels of each ``by``/``without`` clause, the selectors it aggregates over)."""
    out = []
    if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
        out.append((list(node.modifier.labels), selectors(node.expr)))
    for attr in ("lhs", "rhs", "expr"):
        child = getattr(node, attr, None)
        if child is not None:
            out.extend(grouping_labels(child))
    for a in getattr(node, "args", None) or []:
        out.extend(grouping_labels(a))
    return out


def parse(expr: str) -> Any:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return promql_parser.parse(expr)


def test_every_queried_metric_and_label_is_exported(dashboard, exported) -> None:
    exprs = expressions(dashboard)
    assert len(exprs) >= 20
    queried = set()
    for title, expr in exprs:
        tree = parse(expr)  # raises on anything that is not PromQL
        found = selectors(tree)
        assert found, (title, expr)
        for s in found:
            assert s.name in exported, f"panel {title!r} queries {s.name}, which pulsartx does not export"
            queried.add(s.name)
            for m in s.matchers.matchers:
                assert m.name in exported[s.name], f"panel {title!r}: {s.name} has no label {m.name!r}"
        for labels, over in grouping_labels(tree):
            for label in labels:
                assert any(label in exported[s.name] for s in over), f"panel {title!r}: no metric has {label!r}"
    # The families an operator needs most are all on the dashboard.
    assert {"pulsar_txn_active_count", "pulsar_txn_committed_count", "pulsar_txn_aborted_count",
            "pulsar_txn_timeout_count", "pulsartx_partition_max_read_position_lag",
            "pulsartx_partition_oldest_open_txn_age_ms", "pulsar_txn_tp_committed_count_total"} <= queried


def test_template_variables_query_exported_labels(dashboard, exported) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    query = variables["topic"]["query"]["query"]
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query).groups()
    assert label in exported[metric]


def test_dashboard_shape(dashboard) -> None:
    """What Grafana needs to import it: identity, schema version, a Prometheus data source
    variable every panel and target use, unique panel ids, panels inside the 24-column grid."""
    assert dashboard["title"] == "pulsartx" and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0 and g["y"] >= 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat", "bargauge", "table", "gauge"}
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"] and len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        assert all(t["datasource"] == p["datasource"] and t["expr"].strip() for t in p["targets"])


def test_at_most_panels_add_up_the_buckets_below(dashboard) -> None:
    """Each ``*_le_<ms>`` family counts one range, (previous bound, <ms>], as Pulsar's do (see
    test_latency_buckets_are_ranges_not_cumulative), so a panel showing what took at most N ms
    must add every bucket up to N, not read the le_N bucket alone."""
    from pulsartx.metrics import LATENCY_BUCKETS_MS

    checked = 0
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            m = re.fullmatch(r"<= (\d+) ms", t.get("legendFormat", ""))
            if m is None:
                continue
            tree = parse(t["expr"])
            share = isinstance(tree, promql_parser.BinaryExpr) and str(tree.op) == "/"
            counted = tree.lhs if share else tree
            names = {s.name for s in selectors(counted)}
            (family,) = {n.rsplit("_le_", 1)[0] for n in names}
            assert names == {f"{family}_le_{b}" for b in LATENCY_BUCKETS_MS if b <= int(m.group(1))}, (
                panel["title"], t["expr"])
            checked += 1
    assert checked >= 14


def test_latency_buckets_are_ranges_not_cumulative() -> None:
    from prometheus_client.parser import text_string_to_metric_families as families

    from pulsartx import metrics

    metrics.reset()
    for ms in (5, 80, 400):
        metrics.record_pending_ack(True, ms)
    values = {s.name: s.value for f in families(generate_latest(_NoStorage())) for s in f.samples}
    metrics.reset()
    assert [values[f"pulsar_txn_tp_commit_latency_le_{b}"] for b in (10, 20, 50, 100, 500, 1000)] == [1, 0, 0, 1, 1, 0]


class _NoStorage:
    """A client with no TC and no topic: the process-counted families only."""

    class _Tcs:
        count = 0

        def used(self) -> list[int]:
            return []

        def each(self, step, ids=None):
            return iter(())

    class _Admin:
        def list_topics(self) -> list[str]:
            return []

    admin = _Admin()

    def _coordinators(self):
        return self._Tcs()
