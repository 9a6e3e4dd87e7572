"""Scrub credentials from the runner text stored before it was scrubbed on the way in.

Until now environments were scrubbed at ingestion, and errors, failure reasons and the
conditions' reasons at every read. They are now scrubbed once, when stored
(``portal.benchmarks.ingestion``, ``lifecycle.transition``); this migration applies the
same rule (``sharing.scrub`` / ``scrub_value``) to the rows stored before, so no reader
needs to scrub again. Backwards: nothing to undo (what was removed is not kept).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

BATCH = 500


def _batches(model: Any, fields: list[str]) -> Any:
    last = 0
    while True:
        rows = list(model.objects.filter(pk__gt=last).order_by("pk").only("pk", *fields)[:BATCH])
        if not rows:
            return
        last = rows[-1].pk
        yield rows


def scrub_stored(apps: Any, schema_editor: Any) -> None:
    from portal.benchmarks.sharing import scrub, scrub_value

    plans = [
        ("Run", ["failure_reason", "errors"]),
        ("Measurement", ["error", "conditions", "commands", "raw"]),
        ("Environment", ["snapshot"]),
    ]
    for name, fields in plans:
        model = apps.get_model("benchmarks", name)
        for rows in _batches(model, fields):
            changed = []
            for row in rows:
                before = [getattr(row, f) for f in fields]
                after = [scrub(v) if isinstance(v, str) else scrub_value(v) for v in before]
                if after != before:
                    for f, v in zip(fields, after, strict=True):
                        setattr(row, f, v)
                    changed.append(row)
            if changed:
                model.objects.bulk_update(changed, fields)


class Migration(migrations.Migration):
    dependencies = [("benchmarks", "0007_two_identities")]

    operations = [migrations.RunPython(scrub_stored, migrations.RunPython.noop)]
