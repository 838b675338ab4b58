"""Settings of the test project: one database (``TASKS_DATABASE_URL``, a SQLite file or a
PostgreSQL database) holds the shop's tables, the task records and sqlbroker's queue."""

import importlib.util
import json
import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "taskproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "sqlbroker.contrib.django_tasks",
    "shop",
]
if importlib.util.find_spec("django.tasks") is None:  # Django < 6: the backport is an app
    INSTALLED_APPS.insert(1, "django_tasks")
if os.environ.get("TASKS_WITHOUT_APP"):  # what the system check must catch
    INSTALLED_APPS.remove("sqlbroker.contrib.django_tasks")

_url = urlsplit(os.environ["TASKS_DATABASE_URL"])
if _url.scheme == "sqlite":
    _database = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": unquote(_url.path),
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    }
    if os.environ.get("TASKS_SQLITE_DEFERRED"):  # what the system check must warn of
        del _database["OPTIONS"]["transaction_mode"]
else:
    _database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": _url.port or "",
    }
DATABASES = {"default": {**_database, "ATOMIC_REQUESTS": True}}

SQLBROKER = {
    "URL": os.environ.get("TASKS_BROKER_URL"),  # default: the database above
    "OPTIONS": json.loads(os.environ.get("TASKS_BROKER_OPTIONS", "{}")),
}

TASKS = {
    "default": {
        "BACKEND": "sqlbroker.contrib.django_tasks.SqlbrokerBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": json.loads(os.environ.get("TASKS_OPTIONS", "{}")),
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"sqlbroker": {"handlers": ["console"], "level": "WARNING"}},
}
