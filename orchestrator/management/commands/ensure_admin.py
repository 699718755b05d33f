"""Make sure an admin account exists for the quick start.

Uses Django's own DJANGO_SUPERUSER_USERNAME / DJANGO_SUPERUSER_PASSWORD when set; otherwise creates `admin` with a
generated password kept in a 0600 file under the var folder, so every `make run` can print it again.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the quick-start admin user if missing and print how to sign in."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME")
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        secret_file = Path(settings.VAR_DIR) / "admin-password"
        if username and password:
            user, created = User.objects.get_or_create(username=username, defaults={"is_staff": True})
            if created or not user.check_password(password):
                user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
            self.stdout.write(f"admin: {username} (password from DJANGO_SUPERUSER_PASSWORD)")
            return
        username = "admin"
        user = User.objects.filter(username=username).first()
        if user is None or not secret_file.exists():
            password = secrets.token_urlsafe(12)
            secret_file.parent.mkdir(parents=True, exist_ok=True)
            secret_file.touch(mode=0o600, exist_ok=True)
            secret_file.write_text(password)
            user = user or User(username=username)
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
        self.stdout.write(f"admin: {username} / {secret_file.read_text().strip()}  (kept in {secret_file})")
