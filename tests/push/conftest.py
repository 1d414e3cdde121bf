"""Push-consumer test fixtures (defined in push_support.py, which test modules import helpers from)."""
from push_support import cluster  # noqa: F401
