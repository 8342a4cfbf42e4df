"""Spark DataSource V2 classes for pulsartx."""
