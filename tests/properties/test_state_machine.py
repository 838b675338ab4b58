"""The broker state machine on both backends (see machine.py and model.py)."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from properties.machine import BrokerMachine
from properties.profiles import LONG, PROFILE


@pytest.mark.slow
@pytest.mark.timeout(0 if LONG else 300)
def test_the_broker_follows_the_model(backend_url: str) -> None:
    run_state_machine_as_test(BrokerMachine.for_url(backend_url), settings=PROFILE)
