"""Output shapes of the REST API (and input shapes for the OpenAPI schema).

Validation of specs is the runners' pydantic model's job (``intake.spec_from_request``);
the input serializers here only document the body in the schema.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.benchmarks import points as pts
from portal.benchmarks import queries, sharing
from portal.benchmarks.models import Environment, Measurement, Run
from portal.benchmarks.queue import queue_info
from runners import bottleneck as bn
from runners import spec as rs

LATENCY_FIELDS = [
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "p50", "p90", "p99")
]


class RunCreateRequest(serializers.Serializer):
    """Body of POST /api/v1/runs/ (JSON). A raw YAML spec body is accepted too."""

    spec = serializers.JSONField(
        required=False, help_text="A spec object (see /api/v1/spec-schema/)."
    )
    preset = serializers.ChoiceField(
        choices=sorted(rs.PRESETS), required=False, help_text="Instead of spec: a preset's name."
    )
    name = serializers.CharField(required=False, max_length=200)
    is_public = serializers.BooleanField(required=False, default=False)


def paginated(item: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """The envelope a list paginated by ``views.RunPagination`` answers with, around
    ``item`` (for the schema: APIViews do not tell drf-spectacular they paginate)."""
    name = item.__name__.removesuffix("Serializer")
    return type(
        f"Paginated{name}ListSerializer",
        (serializers.Serializer,),
        {
            "__doc__": f"One page of {name} items, newest first.",
            "count": serializers.IntegerField(help_text="Items on all pages."),
            "next": serializers.URLField(allow_null=True, help_text="The next page, if any."),
            "previous": serializers.URLField(
                allow_null=True, help_text="The previous page, if any."
            ),
            "results": item(many=True),
        },
    )


class ProgressSerializer(serializers.Serializer):
    done = serializers.IntegerField()
    total = serializers.IntegerField()


class RunSerializer(serializers.ModelSerializer):
    """A run as listed: status, filters' columns, progress and links."""

    id = serializers.CharField(source="public_id")
    owner = serializers.CharField(source="owner.username")
    failure_reason = serializers.SerializerMethodField(
        help_text="Why it failed: whole for its owner, the first line for other readers."
    )
    storage_problem = serializers.SerializerMethodField(
        help_text=(
            "While the portal cannot store the run's measurements (its samples storage "
            "fails; the runner retries): since when, and what to do. Empty otherwise."
        )
    )
    progress = serializers.SerializerMethodField()
    links = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "status",
            "failure_reason",
            "storage_problem",
            "owner",
            "model_id",
            "gpu_name",
            "gpu_count",
            "backends",
            "progress",
            "is_public",
            "fingerprint",
            "config_fingerprint",
            "created_at",
            "dispatched_at",
            "started_at",
            "finished_at",
            "deadline",
            "links",
        ]

    def get_failure_reason(self, run: Run) -> str:
        return sharing.failure_reason_for(_user(self.context), run)

    def get_storage_problem(self, run: Run) -> str:
        return sharing.storage_notice(_user(self.context), run)

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, run: Run) -> dict[str, int]:
        return {"done": run.progress_done, "total": run.progress_total}

    def get_links(self, run: Run) -> dict[str, str]:
        # The origin once per response, not five build_absolute_uri calls per run.
        origin = self.context.get("_origin")
        if origin is None:
            request = self.context.get("request")
            origin = request.build_absolute_uri("/")[:-1] if request is not None else ""
            self.context["_origin"] = origin
        api = f"{origin}/api/v1/runs/{run.public_id}"
        return {
            "page": f"{origin}{run.get_absolute_url()}",
            "self": f"{api}/",
            "result": f"{api}/result",
            "spec": f"{api}/spec",
            "cancel": f"{api}/cancel",
        }


def _user(context: dict[str, Any]) -> Any:
    request = context.get("request")
    return getattr(request, "user", None)


def run_summaries(runs: Any, request: Any = None) -> list[dict[str, Any]]:
    """RunSerializer's output for many runs, without DRF's per-field machinery (the runs
    list's main cost). ``tests/portal/test_api_runs.py`` checks the two agree."""
    origin = request.build_absolute_uri("/")[:-1] if request is not None else ""
    user = getattr(request, "user", None)
    out = []
    for run in runs:
        api = f"{origin}/api/v1/runs/{run.public_id}"
        out.append(
            {
                "id": run.public_id,
                "name": run.name,
                "status": run.status,
                "failure_reason": sharing.failure_reason_for(user, run),
                "storage_problem": sharing.storage_notice(user, run),
                "owner": run.owner.username,
                "model_id": run.model_id,
                "gpu_name": run.gpu_name,
                "gpu_count": run.gpu_count,
                "backends": run.backends,
                "progress": {"done": run.progress_done, "total": run.progress_total},
                "is_public": run.is_public,
                "fingerprint": run.fingerprint,
                "config_fingerprint": run.config_fingerprint,
                "created_at": run.created_at,
                "dispatched_at": run.dispatched_at,
                "started_at": run.started_at,
                "finished_at": run.finished_at,
                "deadline": run.deadline,
                "links": {
                    "page": f"{origin}{run.get_absolute_url()}",
                    "self": f"{api}/",
                    "result": f"{api}/result",
                    "spec": f"{api}/spec",
                    "cancel": f"{api}/cancel",
                },
            }
        )
    return out


class MeasurementSerializer(serializers.ModelSerializer):
    """A measurement's columns and metrics (raw client output and per-request arrays are in
    the result document)."""

    limited_by = serializers.DictField(
        child=serializers.CharField(),
        read_only=True,
        help_text=(
            "What limited this measurement (runners.bottleneck): {cause, sentence}; cause is "
            "one of " + ", ".join(bn.CAUSES) + "; 'unknown' where the evidence is missing."
        ),
    )

    class Meta:
        model = Measurement
        fields = [
            "backend",
            "backend_kind",
            "point_key",
            "sweep",
            "axis",
            "value",
            "repeat",
            "status",
            "error",
            "input_len",
            "output_len",
            "concurrency",
            "num_prompts",
            "request_rate",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            *LATENCY_FIELDS,
            "preemptions",
            "kv_cache_usage_peak",
            "gpu_memory_peak_bytes",
            "prefix_cache_hit_rate",
            "metrics",
            "server_metrics",
            "started_at",
            "finished_at",
            "duration_s",
            "limited_by",
        ]


# The columns ``measurement_rows`` reads: the serializer's, less what it computes.
MEASUREMENT_FIELDS = tuple(f for f in MeasurementSerializer.Meta.fields if f != "limited_by")


def measurement_rows(run: Run, user: Any = None) -> list[dict[str, Any]]:
    """A run's measurements as MeasurementSerializer's JSON, straight from ``values()``;
    errors as ``user`` may read them (``sharing.error_for``)."""
    manager = queries.may_manage(user, run)
    rows = list(queries.run_measurements(run).values(*MEASUREMENT_FIELDS, "conditions"))
    for row in rows:
        row["error"] = sharing.error_for(manager, row["error"])  # before the sentence quotes it
        row["limited_by"] = bn.diagnose(pts.facts_of(row, row.pop("conditions"))).as_dict()
    return rows


class EnvironmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Environment
        fields = [
            "gpu_name",
            "gpu_count",
            "driver",
            "cuda",
            "vllm_version",
            "torch_version",
            "transformers_version",
            "fingerprint",
            "captured_at",
            "snapshot",
        ]


class WholeNumbersJSONField(serializers.JSONField):
    """A spec as JSON with whole numbers as integers (``rs.whole_numbers``: a sweep of
    ``[1, 4, 16]``, not ``[1.0, 4.0, 16.0]``), as every other place shows a spec."""

    def to_representation(self, value: Any) -> Any:
        return rs.whole_numbers(super().to_representation(value))


class RunDetailSerializer(RunSerializer):
    """A run with its spec, measurements and environment."""

    spec = WholeNumbersJSONField(read_only=True)

    measurements = serializers.SerializerMethodField()
    environment = serializers.SerializerMethodField()
    queue = serializers.SerializerMethodField(
        help_text=(
            "While queued: {position, ahead, slots, busy, message}: the runs ahead of it and "
            "the executor's slots in use. null once dispatched."
        )
    )

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "queue",
            "spec",
            "spec_version",
            "outcome",
            "errors",
            "timings",
            "runner_version",
            "executor",
            "measurements",
            "environment",
        ]

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_queue(self, run: Run) -> dict[str, Any] | None:
        return queue_info(run)

    @extend_schema_field(MeasurementSerializer(many=True))
    def get_measurements(self, run: Run) -> list[dict[str, Any]]:
        # Plain rows from ``measurement_rows``: DRF's per-field machinery costs more than
        # the query for a run with many points.
        return self.context.get("measurements", [])

    @extend_schema_field(EnvironmentSerializer(allow_null=True))
    def get_environment(self, run: Run) -> dict[str, Any] | None:
        env = self.context.get("environment")
        if env is None:
            return None
        return dict(EnvironmentSerializer(env).data)  # scrubbed when stored (ingestion)

    def to_representation(self, run: Run) -> dict[str, Any]:
        data = super().to_representation(run)
        manager = queries.may_manage(_user(self.context), run)
        data["errors"] = [
            {**e, "message": sharing.error_for(manager, e.get("message"))}
            if isinstance(e, dict)
            else e
            for e in data.get("errors") or []
        ]
        return data


class PresetSerializer(serializers.Serializer):
    name = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    spec = serializers.JSONField()


class AcceptedSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    run_status = serializers.CharField()


class MeasurementAcceptedSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    created = serializers.BooleanField()
