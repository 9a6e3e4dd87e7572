"""``manage.py submitrun``: queue a run from a spec file, a preset, or the tiny CPU demo.

    manage.py submitrun --user demo --spec bench.yaml
    manage.py submitrun --user demo --preset seed
    manage.py submitrun --user demo --tiny-demo [MODEL_DIR] --public --wait 900

Prints the run's permalink on stdout (and nothing else), so scripts can capture it.
With ``--wait N`` it waits up to N seconds for the run to end and exits 0 only if it
succeeded (needs a worker and beat running).
"""

import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.benchmarks import intake
from portal.benchmarks.models import Run
from runners import spec as rs


class Command(BaseCommand):
    help = "Queue a benchmark run and print its permalink."

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--spec", help="a YAML or JSON spec file")
        source.add_argument("--preset", choices=sorted(rs.PRESETS))
        source.add_argument(
            "--tiny-demo",
            nargs="?",
            const="",
            metavar="MODEL_DIR",
            help="the CPU demo on the tiny test model (built in the cache if no dir is given)",
        )
        parser.add_argument("--user", required=True, help="owner's username")
        parser.add_argument("--name", default=None)
        parser.add_argument("--public", action="store_true", help="readable by anyone")
        parser.add_argument(
            "--wait", type=int, default=0, metavar="SECONDS", help="wait for the run to end"
        )

    def handle(self, *args, **opts):
        User = get_user_model()
        try:
            owner = User.objects.get(username=opts["user"])
        except User.DoesNotExist:
            raise CommandError(
                f"no user {opts['user']!r}; create one with createsuperuser or createdemo"
            ) from None
        try:
            if opts["spec"]:
                spec = rs.load_spec(opts["spec"])
            elif opts["preset"]:
                spec = rs.preset(opts["preset"])
            else:
                from runners import tiny_model

                model_dir = tiny_model.ensure(opts["tiny_demo"] or None)
                spec = rs.tiny_demo(str(model_dir))
        except rs.SpecError as exc:
            raise CommandError(f"invalid spec: {exc}") from None
        except OSError as exc:
            raise CommandError(f"cannot read the spec: {exc}") from None
        run = intake.create_run(owner, spec, opts["name"], is_public=opts["public"])
        self.stderr.write(f"queued run {run.short_id} ({run.progress_total} measurements)")
        self.stdout.write(f"{settings.SERVEBENCH_PUBLIC_URL}{run.get_absolute_url()}")
        if opts["wait"] > 0:
            self._wait(run, opts["wait"])

    def _wait(self, run: Run, seconds: int) -> None:
        deadline = time.monotonic() + seconds
        last = None
        while time.monotonic() < deadline:
            run.refresh_from_db()
            line = f"{run.status} {run.progress_done}/{run.progress_total}"
            if line != last:
                self.stderr.write(line)
                last = line
            if run.is_final:
                if run.status != "succeeded":
                    raise CommandError(f"run {run.short_id} {run.status}: {run.failure_reason}")
                return
            time.sleep(2)
        raise CommandError(f"run {run.short_id} did not end within {seconds} s ({run.status})")
