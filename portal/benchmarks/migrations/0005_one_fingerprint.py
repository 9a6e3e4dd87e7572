"""Recompute every stored fingerprint with the one definition (``runners.fingerprint``).

Until now the portal (``Run.fingerprint``) and the runner (``Environment.fingerprint``)
hashed different facts, so a run could belong to two series. Both become
``runners.fingerprint.fingerprint(spec, environment snapshot)``; runs without an
environment get the spec-only value the portal gives a queued run. A spec that no longer
parses keeps its old value (it cannot be compared anyway). Backwards: nothing to undo
(the old values cannot be recomputed from a definition that no longer exists).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

BATCH = 500


def recompute(apps: Any, schema_editor: Any) -> None:
    from runners import fingerprint as rf
    from runners import spec as rs

    Run = apps.get_model("benchmarks", "Run")
    Environment = apps.get_model("benchmarks", "Environment")
    last = 0
    while True:
        runs = list(Run.objects.filter(pk__gt=last).order_by("pk").only("pk", "spec")[:BATCH])
        if not runs:
            break
        last = runs[-1].pk
        envs = {
            e.run_id: e
            for e in Environment.objects.filter(run_id__in=[r.pk for r in runs]).only(
                "pk", "run_id", "snapshot", "fingerprint"
            )
        }
        changed = []
        for run in runs:
            try:
                spec = rs.parse_spec(run.spec, stored=True)
            except rs.SpecError:
                continue
            env = envs.get(run.pk)
            snapshot = env.snapshot if env is not None and isinstance(env.snapshot, dict) else None
            run.fingerprint = rf.fingerprint(spec, snapshot)
            changed.append(run)
            if env is not None:
                env.fingerprint = run.fingerprint
        Run.objects.bulk_update(changed, ["fingerprint"])
        Environment.objects.bulk_update(
            [e for e in envs.values() if e.run_id in {r.pk for r in changed}], ["fingerprint"]
        )


class Migration(migrations.Migration):
    dependencies = [("benchmarks", "0004_slots_and_conditions")]

    operations = [migrations.RunPython(recompute, migrations.RunPython.noop)]
