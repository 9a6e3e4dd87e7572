"""``manage.py createtoken USER [--name NAME]``: print a new CI/API token, once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.accounts.tokens import create_user_token


class Command(BaseCommand):
    help = "Create an API token (sb_ci_...) for USER and print it. It is shown only once."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="A label, e.g. 'github-actions'.")

    def handle(self, *args, username: str, name: str, **options):
        User = get_user_model()
        try:
            user = User.objects.get(username=username)
        except User.DoesNotExist:
            raise CommandError(
                f"no user {username!r}; create one with `manage.py createsuperuser` "
                "or `manage.py createdemo`"
            ) from None
        issued = create_user_token(user, name=name)
        self.stderr.write(f"Token for {username} (shown once; store it now, e.g. as a CI secret):")
        self.stdout.write(issued.plaintext)
