"""The URLs of the Django example (`ROOT_URLCONF` of examples/django_settings.py)."""

from __future__ import annotations

from django.urls import path

from examples import django_views

urlpatterns = [path("chat", django_views.chat), path("chat/<str:session_id>", django_views.follow)]
