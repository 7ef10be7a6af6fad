"""Shared pytest configuration."""

from hypothesis import HealthCheck, settings

# CI runs on 2 shared cores: no per-example deadline, a stable example budget.
settings.register_profile(
    "hami", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("hami")

pytest_plugins = ["tests.fakes.pytest_fixtures"]
