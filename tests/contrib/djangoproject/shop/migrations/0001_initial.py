from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("item", models.CharField(max_length=100)),
            ],
        ),
        migrations.CreateModel(
            name="Done",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=100)),
                ("number", models.IntegerField()),
                ("attempt", models.IntegerField(default=1)),
                ("done_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
