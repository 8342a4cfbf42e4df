"""Start-up speed for the test jobs' Python processes (on ``PYTHONPATH`` of spark-submit children only).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python worker's
path. Modules imported from a zip are compiled from source at every start (zipimport keeps no
bytecode cache): 2.5-4 s of CPU per fresh interpreter here, against 0.7-0.9 s for the same pyspark
release installed in the virtualenv, whose bytecode is cached. A streaming run starts about ten
such interpreters (daemons, source runner, sink runner), and Spark gives the source runner a fixed
10 s to connect back, which a busy 2-core machine misses. Moving the zips behind site-packages
makes the installed copy (same version) win; nothing else changes.
"""
import sys

_zips = [p for p in sys.path if p.endswith(("pyspark.zip", "-src.zip")) and "pyspark" in p]
for _p in _zips:
    sys.path.remove(_p)
    sys.path.append(_p)
