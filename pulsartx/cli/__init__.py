"""The ``pulsartx`` admin command line, after ``pulsar-admin``: ``topics``, ``subscriptions`` and
``transactions`` inspect and change a storage root; ``coordinator run``, ``compact`` and
``retention`` are the operational commands. ``main`` assembles the groups; ``common`` holds the
client, the table/JSON output and the error handling they share."""
