"""The saga state machine on both backends, driven by hand: each step message is claimed
and its transition recorded in the transaction that completes it, as the runtime does.
Time comes from a ManualClock, so deadlines are tested without waiting."""

from __future__ import annotations

from typing import Any

import pytest

import sqlbroker
from sqlbroker import Saga, SagaConflict, SagaStatus, Step, StepStatus
from sqlbroker.core.message import Delivery
from sqlbroker.core.settlements import Lease, Settlement

# Driven by hand, with no handlers anywhere: the start's warning says so each time.
pytestmark = pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")

CHECKOUT = Saga(
    "checkout",
    [Step("reserve"), Step("charge"), Step("notify", compensate=False), Step("ship")],
    timeout=600,
)


def _claim(broker: sqlbroker.Broker, step: str, *, undo: bool = False) -> Delivery:
    deliveries = broker.claim(CHECKOUT.queue(step, undo=undo))
    assert len(deliveries) == 1, f"expected one message on {CHECKOUT.queue(step, undo=undo)}"
    return deliveries[0]


def _settle(broker: sqlbroker.Broker, delivery: Delivery, move: str, *args: Any) -> bool:
    """Record a transition and complete its message in one transaction."""
    sagas = broker.sagas
    backend = broker.backend
    saga_id, index = delivery.payload["saga_id"], delivery.payload["step"]
    with backend.begin() as tx:
        moved: bool = getattr(sagas, move)(tx, saga_id, index, delivery.message_id, *args)
        assert tx.message_settle_many(settlements=[Settlement.complete(Lease.of(delivery))])
    return moved


def _statuses(broker: sqlbroker.Broker, saga_id: str) -> list[str]:
    return [step.status.value for step in broker.sagas.get(saga_id).steps]


def test_a_saga_runs_its_steps_in_order_to_completed(clocked_broker: sqlbroker.Broker) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {"order": 7}, saga_id="order-7")
    assert saga_id == "order-7"
    for number, step in enumerate(["reserve", "charge", "notify", "ship"]):
        delivery = _claim(clocked_broker, step)
        assert delivery.payload["step"] == number
        assert _settle(clocked_broker, delivery, "action_done", f'{{"n": {number}}}', 1)
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPLETED
    assert saga.data == {"order": 7}
    assert saga.outputs() == {
        name: {"n": n} for n, name in enumerate(["reserve", "charge", "notify", "ship"])
    }
    assert saga.finished_at is not None
    assert saga.deadline is None
    assert _statuses(clocked_broker, saga_id) == ["done"] * 4


def test_start_is_idempotent_on_the_saga_id(clocked_broker: sqlbroker.Broker) -> None:
    first = clocked_broker.sagas.start(CHECKOUT, {"order": 1}, saga_id="s-1")
    again = clocked_broker.sagas.start(CHECKOUT, {"order": 1}, saga_id="s-1")
    assert first == again == "s-1"
    assert len(clocked_broker.claim(CHECKOUT.queue("reserve"), limit=10)) == 1
    with pytest.raises(SagaConflict):
        clocked_broker.sagas.start(CHECKOUT, {"order": 2}, saga_id="s-1")
    other = Saga("other", ["a"])
    with pytest.raises(SagaConflict):
        clocked_broker.sagas.start(other, {"order": 1}, saga_id="s-1")


def test_start_again_with_equal_data_is_no_conflict(clocked_broker: sqlbroker.Broker) -> None:
    """PostgreSQL keeps the data as jsonb (keys reordered, ``1e16`` written out in full):
    data is compared as JSON values, identically on both backends."""
    data = {
        "sku": "mug",
        "quantity": 2,
        "amount": 19.8,
        "city": "Lisbon",
        "big": 1e16,
        "tiny": 1e-7,
        "one": 1.0,
        "huge": 2**70,
        "items": [1, 2.5, None, True, "x"],
        "nested": {"b": 1, "a": "é"},
    }
    first = clocked_broker.sagas.start(CHECKOUT, data, saga_id="order-9")
    reordered = dict(reversed(list(data.items())))
    assert clocked_broker.sagas.start(CHECKOUT, reordered, saga_id="order-9") == first
    # Numbers are equal when their values are: 2 and 2.0 alike; a bool is not a number.
    assert clocked_broker.sagas.start(CHECKOUT, {**data, "quantity": 2.0}, saga_id=first) == first
    assert len(clocked_broker.claim(CHECKOUT.queue("reserve"), limit=10)) == 1
    for changed in [
        {"one": True},
        {"big": 1e16 + 2},
        {"huge": 2**70 + 1},
        {"items": [2.5, 1, None, True, "x"]},
        {"nested": {"b": 1, "a": "e"}},
        {"city": None},
    ]:
        with pytest.raises(SagaConflict, match="with different data"):
            clocked_broker.sagas.start(CHECKOUT, {**data, **changed}, saga_id=first)


def test_start_inside_the_callers_transaction(clocked_broker: sqlbroker.Broker) -> None:
    backend = clocked_broker.backend

    def start_then_fail() -> None:
        with backend.begin() as conn_tx:
            conn = conn_tx.connection
            clocked_broker.sagas.start(CHECKOUT, {}, saga_id="rolled-back", conn=conn)
            raise RuntimeError("the caller's transaction fails")

    with pytest.raises(RuntimeError):
        start_then_fail()
    assert clocked_broker.sagas.list() == []
    with backend.begin() as conn_tx:
        conn = conn_tx.connection
        clocked_broker.sagas.start(CHECKOUT, {}, saga_id="kept", conn=conn)
    assert [saga.id for saga in clocked_broker.sagas.list()] == ["kept"]
    assert _claim(clocked_broker, "reserve").payload["saga_id"] == "kept"


def test_a_failed_step_compensates_the_done_ones_in_reverse(
    clocked_broker: sqlbroker.Broker,
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    for step in ["reserve", "charge", "notify"]:
        _settle(clocked_broker, _claim(clocked_broker, step), "action_done", "1", 1)
    _settle(clocked_broker, _claim(clocked_broker, "ship"), "action_failed", "no courier", 3)
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATING
    assert saga.error == "step ship failed: no courier"
    # notify has no compensation: charge is undone first, then reserve.
    assert clocked_broker.claim(CHECKOUT.queue("notify", undo=True)) == []
    _settle(clocked_broker, _claim(clocked_broker, "charge", undo=True), "undo_done", 1)
    assert _statuses(clocked_broker, saga_id) == ["compensating", "compensated", "done", "failed"]
    _settle(clocked_broker, _claim(clocked_broker, "reserve", undo=True), "undo_done", 1)
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATED
    assert _statuses(clocked_broker, saga_id) == ["compensated", "compensated", "done", "failed"]
    assert saga.steps[3].attempts == 3
    assert saga.steps[3].error == "no courier"


def test_a_failed_first_step_leaves_nothing_to_compensate(
    clocked_broker: sqlbroker.Broker,
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    _settle(clocked_broker, _claim(clocked_broker, "reserve"), "action_failed", "no stock", 1)
    assert clocked_broker.sagas.get(saga_id).status is SagaStatus.COMPENSATED


def test_transitions_happen_once_however_often_a_message_comes(
    clocked_broker: sqlbroker.Broker,
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    delivery = _claim(clocked_broker, "reserve")
    sagas = clocked_broker.sagas
    with clocked_broker.backend.begin() as tx:
        assert sagas.action_done(tx, saga_id, 0, delivery.message_id, "1", 1)
    with clocked_broker.backend.begin() as tx:
        assert not sagas.action_done(tx, saga_id, 0, delivery.message_id, "2", 1)
        assert not sagas.action_failed(tx, saga_id, 0, delivery.message_id, "late", 1)
    saga = sagas.get(saga_id)
    assert saga.status is SagaStatus.RUNNING
    assert saga.step == 1
    assert saga.outputs() == {"reserve": 1}


def test_a_failing_compensation_fails_the_saga_and_a_replay_resumes(
    clocked_broker: sqlbroker.Broker,
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    for step in ["reserve", "charge"]:
        _settle(clocked_broker, _claim(clocked_broker, step), "action_done", "1", 1)
    _settle(clocked_broker, _claim(clocked_broker, "notify"), "action_failed", "boom", 1)
    undo = _claim(clocked_broker, "charge", undo=True)
    assert clocked_broker.sagas.compensation_failed(saga_id, 1, undo.message_id, "bank down", 5)
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.FAILED
    assert saga.error == "compensation of step charge failed: bank down"
    assert saga.steps[1].status is StepStatus.COMPENSATION_FAILED
    # A person replays the dead letter once the bank is back: the saga resumes.
    _settle(clocked_broker, undo, "undo_done", 6)
    _settle(clocked_broker, _claim(clocked_broker, "reserve", undo=True), "undo_done", 1)
    assert clocked_broker.sagas.get(saga_id).status is SagaStatus.COMPENSATED


def test_cancel_waits_for_the_step_in_flight_then_compensates(
    clocked_broker: sqlbroker.Broker,
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    _settle(clocked_broker, _claim(clocked_broker, "reserve"), "action_done", "1", 1)
    charge = _claim(clocked_broker, "charge")
    assert clocked_broker.sagas.cancel(saga_id, reason="customer changed their mind")
    assert not clocked_broker.sagas.cancel(saga_id)
    # The charge completes after the cancel: it is compensated first, then reserve.
    assert _settle(clocked_broker, charge, "action_done", "1", 1)
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATING
    assert saga.error == "customer changed their mind"
    _settle(clocked_broker, _claim(clocked_broker, "charge", undo=True), "undo_done", 1)
    _settle(clocked_broker, _claim(clocked_broker, "reserve", undo=True), "undo_done", 1)
    assert clocked_broker.sagas.get(saga_id).status is SagaStatus.COMPENSATED


def test_a_cancelled_step_that_never_started_is_skipped(clocked_broker: sqlbroker.Broker) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    _settle(clocked_broker, _claim(clocked_broker, "reserve"), "action_done", "1", 1)
    assert clocked_broker.sagas.cancel(saga_id)
    charge = _claim(clocked_broker, "charge")
    saga = clocked_broker.sagas.find(saga_id)
    assert clocked_broker.sagas.action_verdict(saga, 1, charge.message_id) == "skip"
    _settle(clocked_broker, charge, "action_skipped")
    assert _statuses(clocked_broker, saga_id)[:2] == ["compensating", "cancelled"]
    _settle(clocked_broker, _claim(clocked_broker, "reserve", undo=True), "undo_done", 1)
    assert clocked_broker.sagas.get(saga_id).status is SagaStatus.COMPENSATED


def test_the_sweeper_turns_back_a_saga_past_its_deadline(
    clocked_broker: sqlbroker.Broker, clock: sqlbroker.ManualClock
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    _settle(clocked_broker, _claim(clocked_broker, "reserve"), "action_done", "1", 1)
    assert clocked_broker.sagas.sweep() == 0
    clock.advance(601)
    assert clocked_broker.sagas.sweep() == 1
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATING
    assert saga.error == "timed out at step charge"
    assert saga.deadline is not None
    assert saga.deadline > clock.now()
    _settle(clocked_broker, _claim(clocked_broker, "charge"), "action_skipped")
    clock.advance(601)
    assert clocked_broker.sagas.sweep() == 1
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.FAILED
    assert saga.error is not None
    assert saga.error.startswith("compensations timed out")
    assert clocked_broker.sagas.sweep() == 0


def test_the_sweeper_fails_a_step_whose_message_was_dead_lettered(
    clocked_broker: sqlbroker.Broker,
) -> None:
    saga_id = clocked_broker.sagas.start(CHECKOUT, {})
    _settle(clocked_broker, _claim(clocked_broker, "reserve"), "action_done", "1", 1)
    clocked_broker.dead_letter(_claim(clocked_broker, "charge"), reason="worker lost")
    assert clocked_broker.sagas.sweep() == 1
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.COMPENSATING
    assert saga.steps[1].status is StepStatus.FAILED
    undo = _claim(clocked_broker, "reserve", undo=True)
    clocked_broker.dead_letter(undo, reason="worker lost")
    assert clocked_broker.reap()["sagas_swept"] == 1
    saga = clocked_broker.sagas.get(saga_id)
    assert saga.status is SagaStatus.FAILED
    assert saga.steps[0].status is StepStatus.COMPENSATION_FAILED


def test_listing_and_bad_input(clocked_broker: sqlbroker.Broker) -> None:
    for number in range(3):
        clocked_broker.sagas.start(CHECKOUT, {"n": number}, saga_id=f"s{number}")
    assert len(clocked_broker.sagas.list(name="checkout")) == 3
    assert clocked_broker.sagas.list(status="completed") == []
    assert clocked_broker.sagas.counts() == {"running": 3}
    with pytest.raises(sqlbroker.InvalidOption, match=r"status.*one of running, .*'nope'"):
        clocked_broker.sagas.list(status="nope")
    with pytest.raises(sqlbroker.InvalidPayload, match=r"^data: "):
        clocked_broker.sagas.start(CHECKOUT, {"x": object()})
    with pytest.raises(sqlbroker.NotFound):
        clocked_broker.sagas.get("missing")
    with pytest.raises(sqlbroker.InvalidOption):
        Saga("dup", ["a", "a"])
    with pytest.raises(sqlbroker.InvalidOption):
        Saga("empty", [])


@pytest.mark.filterwarnings("ignore::sqlbroker.SagaWarning")  # no handlers in this test
def test_sagas_are_the_first_operation_of_a_migrating_broker(backend_url: str) -> None:
    """``broker.sagas`` checks (and migrates) the schema like every other operation: a
    saga started before anything else on an empty database finds its tables."""
    with sqlbroker.Broker(backend_url, migrate=True) as broker:
        saga_id = broker.sagas.start(Saga("first", [Step("only")], timeout=60), {"n": 1})
        assert broker.sagas.get(saga_id).status == SagaStatus.RUNNING
