"""The test project's tasks."""

import time
from pathlib import Path

from shop.models import Done
from sqlbroker.contrib.django_tasks.framework import task


@task
def record(number):
    Done.objects.create(task="record", number=number)
    return number


@task(queue_name="emails", priority=10)
def email(number):
    Done.objects.create(task="email", number=number)


@task
def boom(number):
    raise ValueError(f"boom {number}")


@task(takes_context=True)
def slow(context, number, marker):
    """Signals that it started (the marker file), then takes a minute on its first attempt:
    long enough to be killed mid-task. A redelivery finishes at once."""
    attempt = context.attempt
    if attempt == 1:
        Path(marker).write_text("started", encoding="utf-8")
        time.sleep(60)
    Done.objects.create(task="slow", number=number, attempt=attempt)
    return {"number": number, "attempt": attempt}


@task
def shaped(number):
    """Returns what Django normalises: a tuple becomes a list, bytes text, a key text."""
    return {"number": number, 7: (number, b"bytes")}


@task
def unstorable(number):
    """Returns what is not JSON: Django fails such a task."""
    Done.objects.create(task="unstorable", number=number)
    return {number}


@task
def oversized(number):
    """Returns more than the broker's payload limit (256 KiB by default)."""
    return "x" * (300 * 1024)


@task
def noop(number):
    """Does nothing: bench/adapters_django.py measures what the backend itself costs."""


@task
async def arecord(number):
    """A coroutine task: the worker runs it to completion like any other."""
    await Done.objects.acreate(task="arecord", number=number)
