"""SDK test fixtures (defined in sdk_support.py, which test modules import helpers from)."""
from sdk_support import cluster, topic  # noqa: F401
