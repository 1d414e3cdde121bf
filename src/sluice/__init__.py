"""Sluice: a RocketMQ 4.x compatible message queue in Python, built around server-side filtering."""
from sluice.errors import SluiceError
from sluice.message import Message, MessageExt

__version__ = "0.1.0"
__all__ = ["Message", "MessageExt", "SluiceError", "__version__"]
