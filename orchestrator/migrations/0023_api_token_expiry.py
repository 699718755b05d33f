# Hand-written (issue 42, API tokens with an expiry and revocation): orchestrator.ApiToken replaces DRF's authtoken.

import hashlib
from datetime import timedelta

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def carry_over_drf_tokens(apps, schema_editor):
    """Tokens DRF's authtoken issued before this change keep working (a CLI logged in before the upgrade stays logged
    in) until they expire like any new one, TFDASH_API_TOKEN_DAYS from now. Only their hash is carried over, and the
    plain keys are deleted from DRF's table: a database dump must not hold a token anyone could sign in with. The
    table itself is left to its app (no longer installed); on a fresh database it does not exist."""
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("orchestrator", "ApiToken")
    now = django.utils.timezone.now()
    expires = now + timedelta(days=getattr(settings, "TFDASH_API_TOKEN_DAYS", 30))
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id FROM authtoken_token")
        rows = cursor.fetchall()
        ApiToken.objects.using(connection.alias).bulk_create(
            [
                ApiToken(
                    user_id=user_id,
                    digest=hashlib.sha256(key.encode()).hexdigest(),
                    hint=key[:6],
                    name="issued before tokens expired",
                    created_at=now,
                    expires_at=expires,
                )
                for key, user_id in rows
            ],
            ignore_conflicts=True,
        )
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0022_priority_class_rights"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("digest", models.CharField(help_text="hex SHA-256 of the token", max_length=64, unique=True)),
                ("hint", models.CharField(blank=True, max_length=12)),
                (
                    "name",
                    models.CharField(blank=True, help_text="what the client called itself at sign-in", max_length=100),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("expires_at", models.DateTimeField()),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="api_tokens",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["-created_at", "-id"]},
        ),
        migrations.RunPython(carry_over_drf_tokens, migrations.RunPython.noop),
    ]
