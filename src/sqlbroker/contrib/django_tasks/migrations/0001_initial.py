from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="TaskRecord",
            fields=[
                ("id", models.UUIDField(primary_key=True, serialize=False)),
                ("task_path", models.CharField(max_length=255)),
                ("args", models.JSONField(default=list)),
                ("kwargs", models.JSONField(default=dict)),
                ("backend", models.CharField(max_length=100)),
                ("queue_name", models.CharField(max_length=100)),
                ("priority", models.IntegerField(default=0)),
                ("run_after", models.DateTimeField(null=True)),
                ("enqueued_at", models.DateTimeField()),
                ("keep_until", models.DateTimeField(db_index=True)),
            ],
            options={"db_table": "django_sqlbroker_task"},
        ),
    ]
