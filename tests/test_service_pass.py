"""The coordinator service's pass (``pulsartx coordinator run``): what it must survive."""
from __future__ import annotations

import pulsartx


def test_a_service_pass_goes_on_past_a_topic_deleted_while_it_lists_them(tmp_path, monkeypatch):
    """A topic listed, then deleted by another process before the pass reads its partitions, must
    not end the pass: the topics after it are settled all the same (every pass would otherwise
    skip them while topics come and go)."""
    from pulsartx import service

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
