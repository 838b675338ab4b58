"""``manage.py migrate`` also creates (or upgrades) sqlbroker's own tables in the broker's
database, so a Django project needs no separate ``sqlbroker migrate``. sqlbroker migrates
on a connection of its own, outside Django's migration transaction (on SQLite that
transaction would hold the write lock the migration needs)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def migrate_sqlbroker(apps: Any, schema_editor: Any) -> None:
    from sqlbroker.app import Broker
    from sqlbroker.contrib.django import broker_settings

    url, options = broker_settings()
    options["migrate"] = True
    with Broker(url, **options) as broker:
        broker.migrate()


class Migration(migrations.Migration):  # type: ignore[misc]
    atomic = False

    dependencies = [("sqlbroker_tasks", "0001_initial")]

    operations = [migrations.RunPython(migrate_sqlbroker, migrations.RunPython.noop)]
