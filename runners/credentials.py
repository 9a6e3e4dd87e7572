"""The environment variables that hold the portal's and the runner's own credentials.

An endpoint backend's API key is read from an environment variable the spec names
(``api_key.env``; a Kubernetes Secret reaches the runner as
``SERVEBENCH_ENDPOINT_KEY_<NAME>_<hash>``) and sent to the endpoint as a bearer token. A
variable that holds a credential the portal or the runner uses for something else (the
hub token, the run token, the database URL, the storage's keys...) must never be that
variable, whatever an admin's list (``SERVEBENCH_ENDPOINT_KEY_ENVS``) says: the endpoint
would receive the credential.

``reserved(name)`` is the one rule: what the variable is used for, or None when it may
hold an endpoint key. Three places apply it: the portal's settings (an admin list naming
one fails at start-up), the portal's policy (a spec naming one is refused at submit,
``backends.<i>.api_key.env``), and the runner (it never reads one as a key, so a spec
that reached it another way is refused at run time too).

Pure Python, no dependencies: the settings module imports it.
"""

from __future__ import annotations

# Exact names, with what each one is. NAME_FILE (a secret read from a file by
# ``portal.lib.env``) counts as NAME.
CREDENTIAL_VARIABLES: dict[str, str] = {
    "HF_TOKEN": "the Hugging Face hub token the runner downloads models with",
    "HUGGING_FACE_HUB_TOKEN": "the Hugging Face hub token (its older name)",
    "SECRET_KEY": "the portal's signing key",
    "DATABASE_URL": "the portal's database URL (with its password)",
    "REDIS_URL": "the portal's broker URL",
    "CELERY_BROKER_URL": "the portal's broker URL",
    "KUBECONFIG": "the Kubernetes credentials the portal creates runner Jobs with",
}
# Whole families: every variable starting with one of these.
CREDENTIAL_PREFIXES: dict[str, str] = {
    "SERVEBENCH_": (
        "one of servebench's own settings and secrets (the run token SERVEBENCH_RUN_TOKEN, "
        "the API-token key SERVEBENCH_TOKEN_KEY, the CLI's SERVEBENCH_TOKEN...)"
    ),
    "HF_": "a Hugging Face hub setting or token (HF_TOKEN, HF_HUB_TOKEN...)",
    "HUGGING_FACE_": "a Hugging Face hub setting or token",
    "AWS_": "an AWS credential (the sample storage's S3 keys)",
}
# ...except the variables the Kubernetes executor fills from an endpoint's Secret
# (``runners.spec.EndpointBackend.key_env``): they hold endpoint keys and nothing else.
ENDPOINT_KEY_PREFIX = "SERVEBENCH_ENDPOINT_KEY_"


def reserved(name: str) -> str | None:
    """What the environment variable ``name`` is used for, when it holds a credential of
    the portal or the runner (so it must never be read as an endpoint's key); None when
    it may hold one."""
    base = name.upper().removesuffix("_FILE")
    if base.startswith(ENDPOINT_KEY_PREFIX):
        return None
    if base in CREDENTIAL_VARIABLES:
        return CREDENTIAL_VARIABLES[base]
    for prefix, what in CREDENTIAL_PREFIXES.items():
        if base.startswith(prefix):
            return what
    return None


def refusal(name: str) -> str | None:
    """The sentence that refuses ``name`` as an endpoint key variable, or None."""
    what = reserved(name)
    if what is None:
        return None
    return (
        f"{name} is {what}; it is never sent to an endpoint, whatever "
        "SERVEBENCH_ENDPOINT_KEY_ENVS lists: give the endpoint's key a variable of its own "
        "(e.g. PROD_ENDPOINT_API_KEY)"
    )
