"""Maps a Spark write job or micro-batch to one pulsartx transaction."""
