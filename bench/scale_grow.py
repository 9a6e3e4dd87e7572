"""Grow the database ``bench/portal_scale.py --keep`` left to N times its generated runs, in SQL.

    python bench/portal_scale.py --runs 10000 --keep
    python bench/scale_grow.py --copies 9
    python bench/portal_scale.py --runs 100000 --measurements 2000000 --reuse

Each copy repeats every generated run (not the compare and history runs), with its
environment and measurements, under new ids and public ids, older than the copy before;
users, models, GPUs, statuses and series keep their shapes and distributions. Ten times
the 10,000-run fill takes ~6 minutes on two shared cores, where the generator takes 21+.
Uses DATABASE_URL as ``portal_scale.py`` does (its ``test_<name>_scale`` database).
"""

# ruff: noqa: S608 - SQL from this file's constants and the database's own column names

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FIXTURES = "fingerprint NOT IN (repeat('c', 64), repeat('d', 64))"  # compare, history runs
RUN_STEP = 1_000_000  # copy g's run ids: the original's + g * RUN_STEP
MEASUREMENT_STEP = 10_000_000
SHIFTED = ("created_at", "updated_at", "dispatched_at", "started_at", "finished_at", "deadline")


def columns(cursor: object, table: str) -> list[str]:
    cursor.execute(  # type: ignore[attr-defined]
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "ORDER BY ordinal_position",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]  # type: ignore[attr-defined]


def copy_sql(table: str, cols: list[str], select: dict[str, str], where: str) -> str:
    chosen = ", ".join(select.get(c, c) for c in cols)
    return f"INSERT INTO {table} ({', '.join(cols)}) SELECT {chosen} FROM {table} WHERE {where}"


def grow(copies: int) -> None:
    from django.db import connection

    originals = (
        f"run_id < {RUN_STEP} AND run_id IN (SELECT id FROM benchmarks_run WHERE {FIXTURES})"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM benchmarks_run "
            f"WHERE {FIXTURES}"
        )
        span = float(cursor.fetchone()[0] or 0) + 1500
        runs = columns(cursor, "benchmarks_run")
        envs = columns(cursor, "benchmarks_environment")
        measurements = columns(cursor, "benchmarks_measurement")
        t0 = time.perf_counter()
        for g in range(1, copies + 1):
            shift = f"(interval '1 second' * {span * g})"
            run_select = {c: f"{c} - {shift}" for c in SHIFTED}
            run_select["id"] = f"id + {g * RUN_STEP}"
            run_select["public_id"] = "left(md5(random()::text || id::text), 20)"
            cursor.execute(
                copy_sql("benchmarks_run", runs, run_select, f"id < {RUN_STEP} AND {FIXTURES}")
            )
            moved = {"id": f"id + {g * RUN_STEP}", "run_id": f"run_id + {g * RUN_STEP}"}
            cursor.execute(copy_sql("benchmarks_environment", envs, moved, originals))
            moved["id"] = f"id + {g * MEASUREMENT_STEP}"
            cursor.execute(copy_sql("benchmarks_measurement", measurements, moved, originals))
            print(f"copy {g} of {copies}: {time.perf_counter() - t0:.0f} s", flush=True)
        for table in ("benchmarks_run", "benchmarks_environment", "benchmarks_measurement"):
            highest = f"(SELECT max(id) FROM {table})"
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), {highest})")
        cursor.execute("DELETE FROM web_storedpage")  # pages built before the copies
        cursor.execute("VACUUM ANALYZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=9, help="copies to add (9: ten times)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("SECRET_KEY", "bench-scale-grow-" + "x" * 32)
    os.environ.setdefault("SERVEBENCH_PUBLIC_URL", "http://testserver")
    import django

    django.setup()
    from django.db import connection

    connection.settings_dict["NAME"] = f"test_{connection.settings_dict['NAME']}_scale"
    grow(args.copies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
