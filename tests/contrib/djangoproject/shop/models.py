from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)


class Done(models.Model):
    """One row per task run that finished: what ran, with which argument, on which attempt."""

    task = models.CharField(max_length=100)
    number = models.IntegerField()
    attempt = models.IntegerField(default=1)
    done_at = models.DateTimeField(auto_now_add=True)
