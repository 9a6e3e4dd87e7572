"""Stored pages get a subject (the page without its stamps): compare and history pages
are kept too, and a newer page of a subject replaces the older row. The rows stored
before have none and no newer page would replace them: they are deleted (a cache; each
run's page is built again by its next reader)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("web", "0001_stored_page"),
    ]

    operations = [
        migrations.RunSQL("DELETE FROM web_storedpage", migrations.RunSQL.noop),
        migrations.AddField(
            model_name="storedpage",
            name="subject",
            field=models.CharField(db_index=True, default="", max_length=100),
            preserve_default=False,
        ),
    ]
