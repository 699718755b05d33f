"""WebSocket routes."""

from __future__ import annotations

from django.urls import path

from dashboard.consumers import JobConsumer

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/", JobConsumer.as_asgi()),
]
