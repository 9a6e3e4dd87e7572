"""Schedule pages: the signed-in user's schedules (create from a preset or a spec), and
one schedule's page (its firings, pause/resume, delete). Rules: ``portal.schedules``."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal.benchmarks import presets
from portal.schedules import editing
from portal.schedules.models import Cadence, Schedule
from runners import spec as rs


class ScheduleForm(forms.Form):
    name = forms.CharField(max_length=200)
    label = forms.CharField(max_length=100, help_text="The series its runs are labelled into.")
    cadence = forms.ChoiceField(choices=Cadence.choices)
    at = forms.CharField(max_length=5, initial="02:00", help_text="HH:MM, UTC.")
    every_hours = forms.IntegerField(
        required=False, min_value=1, help_text="For every N hours (e.g. 4)."
    )
    preset = forms.ChoiceField(required=False, help_text="Or leave empty and give a spec.")
    spec = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 12, "class": "mono"})
    )
    is_public = forms.BooleanField(required=False, label="Its runs are public")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["preset"].choices = [("", "—")] + [
            (name, name) for name in sorted(presets.available())
        ]

    def body(self) -> dict[str, Any]:
        data = self.cleaned_data
        body: dict[str, Any] = {
            "name": data["name"],
            "label": data["label"],
            "cadence": data["cadence"],
            "at": data["at"],
            "is_public": data["is_public"],
        }
        if data["cadence"] == Cadence.HOURS:
            body["every_hours"] = data.get("every_hours")
        if data.get("preset"):
            body["preset"] = data["preset"]
        else:
            body["spec"] = data.get("spec") or ""
        return body


@login_required
@require_http_methods(["GET", "POST"])
def schedule_list(request: HttpRequest) -> HttpResponse:
    form = ScheduleForm()
    status = 200
    if request.method == "POST":
        form = ScheduleForm(request.POST)
        if form.is_valid():
            try:
                schedule = editing.create(request.user, form.body())
            except editing.ScheduleError as exc:
                for error in exc.errors[:5]:
                    field = error.get("field") or ""
                    name = field if field in form.fields else None
                    where = "" if name or not field else f"{field}: "
                    form.add_error(name, f"{where}{error.get('message', exc)}")
                status = exc.status
            else:
                messages.success(
                    request,
                    f"Schedule {schedule.name!r} created; it first runs at "
                    f"{schedule.next_run_at:%Y-%m-%d %H:%M} UTC.",
                )
                return redirect("web:schedule", schedule.public_id)
        else:
            status = 400
    context = {"form": form, "schedules": list(editing.visible(request.user))}
    return render(request, "web/schedules.html", context, status=status)


def _mine(request: HttpRequest, public_id: str) -> Schedule:
    try:
        return editing.get(request.user, public_id)
    except Schedule.DoesNotExist:
        raise Http404("No such schedule of yours.") from None


@login_required
def schedule_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    schedule = _mine(request, public_id)
    context = {
        "schedule": schedule,
        "firings": list(editing.history(schedule)),
        "spec_yaml": rs.dump_spec(rs.parse_spec(schedule.spec, stored=True)),
    }
    return render(request, "web/schedule_detail.html", context)


@login_required
@require_POST
def schedule_action(request: HttpRequest, public_id: str) -> HttpResponse:
    """Pause, resume or delete (the form's ``action``)."""
    schedule = _mine(request, public_id)
    action = request.POST.get("action")
    if action == "delete":
        schedule.delete()
        messages.success(request, f"Schedule {schedule.name!r} is deleted; its runs stay.")
        return redirect("web:schedules")
    if action in ("pause", "resume"):
        editing.set_enabled(schedule, action == "resume")
        messages.success(request, f"Schedule {schedule.name!r} is {action}d.")
    return redirect("web:schedule", schedule.public_id)
