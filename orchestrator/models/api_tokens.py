"""API tokens: what `POST /api/token/` (`tfdash login`) hands out, one per sign-in, so a user may hold several (a
laptop, a CI runner) and revoke each on its own. Only the SHA-256 of a token is stored: a token is 256 random bits, so
no stretching is needed, and a database dump yields nothing to sign in with. orchestrator/identity/api_tokens.py
issues, finds and revokes them; orchestrator/api/token_auth.py checks them on every request.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True, help_text="hex SHA-256 of the token")
    # The token's first characters, so its owner can tell which one a row is (never enough to use it).
    hint = models.CharField(max_length=12, blank=True)
    name = models.CharField(max_length=100, blank=True, help_text="what the client called itself at sign-in")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    # Written at most once a minute per token (orchestrator/identity/api_tokens.py), not on every request.
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.name or f"token {self.hint}…"

    @property
    def expired(self) -> bool:
        return self.expires_at <= timezone.now()
