"""Hypothesis settings for the property tests.

``SQLBROKER_HYPOTHESIS_PROFILE`` picks one: ``ci`` (the default: bounded and derandomized,
so CI runs the same examples every time) or ``long`` (many more random examples, for a run
by hand; see README.md). ``SQLBROKER_HYPOTHESIS_EXAMPLES=N`` sets every test's example
count to ``N`` under either profile. The profiles are applied per test (``@PROFILE`` or
``settings=PROFILE``), so Hypothesis tests elsewhere in the suite keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "sqlbroker-ci",
    max_examples=25,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "sqlbroker-long",
    max_examples=1_000,
    stateful_step_count=100,
    derandomize=False,
    deadline=None,
    print_blob=True,
    phases=list(Phase),
    suppress_health_check=_SLOW_OK,
)

NAME = os.environ.get("SQLBROKER_HYPOTHESIS_PROFILE", "ci")
if NAME not in ("ci", "long"):
    raise RuntimeError(f"SQLBROKER_HYPOTHESIS_PROFILE must be 'ci' or 'long', not {NAME!r}")
PROFILE = settings.get_profile(f"sqlbroker-{NAME}")
LONG = NAME == "long"
_EXAMPLES = os.environ.get("SQLBROKER_HYPOTHESIS_EXAMPLES")
if _EXAMPLES:
    PROFILE = settings(PROFILE, max_examples=int(_EXAMPLES))


def scaled(ci: int, long: int) -> settings:
    """The profile with its example count set for one test (``ci`` under CI, ``long`` under
    the long profile; ``SQLBROKER_HYPOTHESIS_EXAMPLES`` overrides both)."""
    if _EXAMPLES:
        return PROFILE
    return settings(PROFILE, max_examples=long if LONG else ci)
