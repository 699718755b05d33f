"""What the control plane's Celery app and every agent's share about the broker connection: plain Kombu, no Django,
no agent or control-plane code (both sides import it; it imports neither)."""
