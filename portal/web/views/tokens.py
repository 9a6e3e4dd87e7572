"""API tokens: create (shown once) and revoke the signed-in user's CI tokens."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_http_methods

from portal.accounts.models import ApiToken
from portal.accounts.tokens import create_user_token, revoke_token
from portal.web.forms import TokenForm


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    new_plaintext = None
    form = TokenForm()
    if request.method == "POST":
        if "revoke" in request.POST:
            pk = request.POST.get("revoke", "")
            token = (
                ApiToken.objects.filter(
                    pk=int(pk), user=request.user, kind=ApiToken.Kind.CI
                ).first()
                if pk.isascii() and pk.isdigit() and len(pk) <= 18
                else None
            )
            if token is not None and revoke_token(token):
                messages.success(request, f"Token {token} is revoked.")
            else:
                messages.error(request, "No such token of yours, or it was already revoked.")
            return redirect("web:tokens")
        form = TokenForm(request.POST)
        if form.is_valid():
            issued = create_user_token(request.user, form.cleaned_data["name"])
            new_plaintext = issued.plaintext
            form = TokenForm()
    user_tokens = ApiToken.objects.filter(user=request.user, kind=ApiToken.Kind.CI)
    context: dict[str, Any] = {
        "form": form,
        "tokens": user_tokens,
        "new_plaintext": new_plaintext,
        "api_base": request.build_absolute_uri("/api/v1/"),
    }
    response = render(request, "web/tokens.html", context)
    # The page shows a new token once: no cache (browser, proxy) may keep a copy.
    patch_cache_control(response, no_store=True, no_cache=True, private=True, max_age=0)
    return response
