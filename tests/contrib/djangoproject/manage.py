"""The test Django project's manage.py (tests/contrib/test_django_tasks.py runs it)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
