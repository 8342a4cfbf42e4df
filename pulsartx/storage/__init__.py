"""Storage: the root (URL + options) and the few Delta operations everything else is built on."""
from pulsartx.storage.root import StorageRoot

__all__ = ["StorageRoot"]
