"""A cluster's object store seen from the control plane: credentials, presigned URLs, HEAD and DELETE.

May import: contracts, orchestrator.models."""
