"""Suite-wide settings. Hypothesis deadlines are off: CI shares two cores with servers the tests start,
so a slow example is load, not a bug (each property still bounds its own work by max_examples)."""
from hypothesis import HealthCheck, settings

settings.register_profile("sluice", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluice")
