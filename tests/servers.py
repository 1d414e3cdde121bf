"""Test-side name for the server launcher; the code lives in ``sluice.embedded`` (the demo uses it too)."""
from sluice.embedded import SluiceProcess, free_port, port_accepts, wait_for_port

__all__ = ["SluiceProcess", "free_port", "port_accepts", "wait_for_port"]
