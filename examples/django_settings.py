"""A runnable Django settings module for `examples/django_views.py`:

    pip install 'fxworker[examples]'
    DJANGO_SETTINGS_MODULE=examples.django_settings django-admin runserver 127.0.0.1:8003

Without REDIS_URL the turns run in this process (the embedded mode); with it, run
`FX_AGENTS=examples.agents fx worker` beside it.

CSRF: the two views are an API called with JSON by your own front end, so they are exempt
from Django's CSRF middleware (`csrf_exempt`) and refuse any body that is not
`Content-Type: application/json` instead: a cross-site form cannot send JSON without a CORS
preflight, which this app does not answer. If your pages post with Django's session cookie,
keep the middleware and send the `X-CSRFToken` header instead.
"""

from __future__ import annotations

SECRET_KEY = "examples-only-not-a-secret"  # noqa: S105 - a development settings module
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "examples.django_urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["django.middleware.common.CommonMiddleware", "django.middleware.csrf.CsrfViewMiddleware"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
