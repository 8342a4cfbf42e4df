"""The transaction buffer (PIP-31 marker approach): markers, maxReadPosition, aborted set, snapshots,
and the isolation-level read path."""
