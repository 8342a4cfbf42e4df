"""Pulsar's producer compression types, applied to the payload column of the partition log.

Pulsar compresses each batch with the producer's ``compressionType`` (NONE by default). Here a
batch is a parquet file, so the type becomes the codec of the file's ``value`` column; the other
columns (offsets, sequence ids, types, keys) are small and always zstd level 1. NONE is the right
default for the reason Pulsar has it: compressing incompressible payloads (encrypted, already
compressed, random) costs most of an append's CPU for nothing (zstd-1 on 100-byte random values:
62 of 95 ms per 125,000-row file, measured here), while JSON-like payloads pick ZSTD or LZ4.
"""
from __future__ import annotations

from enum import Enum

from pulsartx.exceptions import InvalidConfiguration


class CompressionType(Enum):
    """pulsar-client's names (``pulsar.CompressionType``), ZLib spelling included."""

    NONE = "NONE"
    LZ4 = "LZ4"
    ZLib = "ZLib"
    ZSTD = "ZSTD"
    SNAPPY = "SNAPPY"

    @property
    def parquet_codec(self) -> str:
        """pyarrow's codec name: LZ4 is parquet's LZ4_RAW, ZLib is its GZIP (deflate)."""
        return {"NONE": "none", "LZ4": "lz4", "ZLib": "gzip", "ZSTD": "zstd", "SNAPPY": "snappy"}[self.value]

    @classmethod
    def parse(cls, value: CompressionType | str | None, option: str = "compression_type") -> CompressionType:
        if value is None:
            return DEFAULT_COMPRESSION
        if isinstance(value, CompressionType):
            return value
        for member in cls:
            if str(value).strip().upper() == member.value.upper():
                return member
        raise InvalidConfiguration(f"{option}={value!r} is not a compression type: use one of "
                                   f"{', '.join(m.value for m in cls)} (default {DEFAULT_COMPRESSION.value})")


DEFAULT_COMPRESSION = CompressionType.NONE
