"""Two identities (issue: judge the change): what a run measured and what it put under test.

``Run.fingerprint`` becomes the measurement's hash (``runners.fingerprint.fingerprint``:
workload, points, GPU type and count) and ``Run.config_fingerprint`` holds the
configuration's (model, every backend's engine and flags). Both are recomputed for every
stored run from its spec and environment snapshot, as 0005 did for the one before; a spec
that no longer parses keeps its old fingerprint and no configuration (it cannot be
compared anyway). Backwards: the column goes; the old values cannot be recomputed from a
definition that no longer exists.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

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
            identity = rf.Identity.of(spec, snapshot)
            run.fingerprint = identity.fingerprint
            run.config_fingerprint = identity.configuration_fingerprint
            changed.append(run)
            if env is not None:
                env.fingerprint = run.fingerprint
        Run.objects.bulk_update(changed, ["fingerprint", "config_fingerprint"])
        Environment.objects.bulk_update(
            [e for e in envs.values() if e.run_id in {r.pk for r in changed}], ["fingerprint"]
        )


class Migration(migrations.Migration):
    dependencies = [("benchmarks", "0006_measurement_samples_in_storage")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="config_fingerprint",
            field=models.CharField(
                blank=True,
                help_text=(
                    "What the run put under test (runners.fingerprint.configuration: model, "
                    "every backend's engine and flags): the change a comparison judges."
                ),
                max_length=64,
            ),
        ),
        migrations.AlterField(
            model_name="run",
            name="fingerprint",
            field=models.CharField(
                blank=True,
                help_text=(
                    "What the run measured (runners.fingerprint.measurement: workload, points, "
                    "GPU type and count): runs with the same fingerprint are comparable."
                ),
                max_length=64,
            ),
        ),
        migrations.RunPython(recompute, migrations.RunPython.noop),
    ]
