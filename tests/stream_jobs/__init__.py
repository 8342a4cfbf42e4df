"""spark-submit job scripts and parent-side helpers for the Structured Streaming tests."""
