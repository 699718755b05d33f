"""A cluster's object store seen from the control plane (store.py): the only holder of its credentials, presigned
URLs for a task's own keys, HEAD and DELETE, download redirects.

May import: contracts, models."""
