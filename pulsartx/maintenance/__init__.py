"""Maintenance passes: compaction (PIP-31's "sweep", Kafka's compaction with transactions) and
retention. Both only ever swap whole files below maxReadPosition, atomically, and leave removed
files on disk until vacuum, so concurrent readers and writers are unaffected."""
