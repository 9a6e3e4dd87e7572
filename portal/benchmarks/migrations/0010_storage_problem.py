from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("benchmarks", "0009_fair_use_and_retention")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="storage_problem",
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name="run",
            name="storage_problem_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
