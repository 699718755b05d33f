"""manage.py commands: ingest_metrics (one partition of the metrics ingest), submit, local_cluster (the quick
start's cluster), ensure_admin. Entry points: each hands the work to the package that owns it.

May import: contracts, models, plumbing, identity, metrics, submit."""
