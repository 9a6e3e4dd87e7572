"""``manage.py createdemo [--json]``: the quickstart's demo user, idempotently.

The password is stable across calls (``SERVEBENCH_DEMO_PASSWORD``, else generated once
and kept in ``$SERVEBENCH_HOME/dev/demo-password``, mode 600), so a browser session
survives a restart of ``make run``. The CI token named "quickstart" is kept the same way
(``$SERVEBENCH_HOME/dev/demo-token``, mode 600, beside the password), so the token an
earlier ``make run`` printed (and a shell exported) keeps working; a new one is issued,
and any other quickstart token revoked, only when the kept one no longer verifies. For
development only: it refuses to run unless DEBUG or SERVEBENCH_QUICKSTART is on.
"""

import json
import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.accounts.models import ApiToken
from portal.accounts.tokens import create_user_token, revoke_token, verify_token

TOKEN_NAME = "quickstart"  # noqa: S105 - a label, not a secret


def _dev_file(name: str) -> Path:
    return Path(settings.SERVEBENCH_HOME) / "dev" / name


def _keep(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)


def demo_token(user: Any) -> tuple[str, bool]:
    """(the demo user's quickstart token, whether it is the one kept from before)."""
    path = _dev_file("demo-token")
    kept = path.read_text(encoding="utf-8").strip() if path.exists() else ""
    found = verify_token(kept) if kept else None
    if found is not None and found.user_id == user.pk and found.name == TOKEN_NAME:
        return kept, True
    for old in ApiToken.objects.filter(
        user=user, kind=ApiToken.Kind.CI, name=TOKEN_NAME, revoked_at__isnull=True
    ):
        revoke_token(old)
    token = create_user_token(user, name=TOKEN_NAME).plaintext
    _keep(path, token)
    return token, False


def demo_password() -> str:
    from_env = os.environ.get("SERVEBENCH_DEMO_PASSWORD")
    if from_env:
        return from_env
    path = settings.SERVEBENCH_HOME / "dev" / "demo-password"
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(12)
    path.write_text(password, encoding="utf-8")
    path.chmod(0o600)
    return password


class Command(BaseCommand):
    help = "Create or refresh the demo user (development only) and print its credentials."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument(
            "--json",
            dest="as_json",
            action="store_true",
            help="print {username, password, token} as JSON",
        )

    def handle(self, *args, username: str, as_json: bool, **options):
        if not settings.DEV:
            raise CommandError(
                "createdemo is for development (DEBUG=1 or SERVEBENCH_QUICKSTART=1); "
                "in production use createsuperuser and createtoken"
            )
        User = get_user_model()
        password = demo_password()
        user, created = User.objects.get_or_create(username=username)
        if created or not user.check_password(password):
            user.set_password(password)
            user.is_active = True
            user.save()
        token, kept = demo_token(user)
        creds = {"username": username, "password": password, "token": token, "kept": kept}
        if as_json:
            self.stdout.write(json.dumps(creds))
        else:
            self.stdout.write(
                f"demo user {'created' if created else 'ready'}\n"
                f"username: {username}\npassword: {password}\n"
                f"API token ({'the same as before' if kept else 'new'}): {token}"
            )
