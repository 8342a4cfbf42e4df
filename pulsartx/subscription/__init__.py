"""Durable subscriptions without a broker: each partition's cursor and pending-ack store
(``cursor``, ``store``, ``ranges``), who may consume (``leases``), the TC's participant calls that
end pending acks (``pendingack``), and the resolution of pending acks whose transaction can no
longer end them (``resolution``)."""
