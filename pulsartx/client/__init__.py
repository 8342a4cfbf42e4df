"""The Python client (names from pulsar-client): Client, Producer, Reader, Consumer, Transaction."""
from pulsartx.client.client import Client
from pulsartx.client.message import Message
from pulsartx.client.producer import Producer
from pulsartx.client.reader import Reader
from pulsartx.client.result import Result

__all__ = ["Client", "Message", "Producer", "Reader", "Result"]
