"""Protocol 3: a host keeps the HKDF-derived key of its messages, encrypted with the control plane's key, instead of
sha256(token) (which signed orders and was enough to forge them). A key cannot be derived from the old digest:
hosts registered before this need a new token (admin: "Issue a new agent token")."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0008_per_user_limits"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="host",
            name="token_hash",
        ),
        migrations.AddField(
            model_name="host",
            name="agent_key",
            field=models.CharField(blank=True, editable=False, max_length=200),
        ),
    ]
