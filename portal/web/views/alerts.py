"""The alerts page: the signed-in user's subscriptions (add, remove) and their recent
deliveries with their state. The rules are ``portal.alerts.subscriptions``'."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_http_methods

from portal.alerts import subscriptions as subs
from portal.alerts.models import Channel


class SubscriptionForm(forms.Form):
    label = forms.CharField(
        max_length=100, help_text="The series' label, e.g. main or nightly.", required=True
    )
    owner = forms.CharField(
        max_length=150,
        required=False,
        help_text="Whose runs (empty: yours; another user's only where you see public runs).",
    )
    fingerprint = forms.CharField(
        max_length=64, required=False, help_text="One series only (empty: every series)."
    )
    channel = forms.ChoiceField(choices=Channel.choices)
    target = forms.CharField(
        max_length=500,
        required=False,
        help_text="The webhook URL, or the email address (empty: your own).",
    )


@login_required
@require_http_methods(["GET", "POST"])
def alerts_page(request: HttpRequest) -> HttpResponse:
    form = SubscriptionForm()
    secret = None
    status = 200
    if request.method == "POST":
        if "remove" in request.POST:
            if subs.unsubscribe(request.user, str(request.POST.get("remove", ""))[:20]):
                messages.success(request, "The subscription is removed.")
            else:
                messages.error(request, "No such subscription of yours.")
            return redirect("web:alerts")
        form = SubscriptionForm(request.POST)
        if form.is_valid():
            try:
                made = subs.subscribe(request.user, **form.cleaned_data)
            except subs.SubscriptionError as exc:
                name = exc.field if exc.field in form.fields else None
                form.add_error(name, str(exc))
                status = exc.status
            else:
                secret = made.secret
                messages.success(request, f"Subscribed to {made.subscription.label}.")
                form = SubscriptionForm()
        else:
            status = 400
    context: dict[str, Any] = {
        "form": form,
        "subscriptions": list(subs.mine(request.user)),
        "deliveries": list(subs.recent_deliveries(request.user)),
        "secret": secret,
        "email_enabled": subs.email_enabled(),
    }
    response = render(request, "web/alerts.html", context, status=status)
    # A webhook's secret is shown once: no cache may keep a copy.
    patch_cache_control(response, no_store=True, no_cache=True, private=True, max_age=0)
    return response
