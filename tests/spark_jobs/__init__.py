"""Spark job scripts that tests run with ``spark-submit`` in a subprocess, and the parent-side
harness that starts, watches and SIGKILLs them (:mod:`spark_jobs.harness`)."""
