"""The plain-Python core of the control plane (no Django, no Celery): gang placement of a job onto hosts, the
TF_CONFIG and environment every task gets, and which failures the restart policy retries. Tested directly."""
