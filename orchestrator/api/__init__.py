"""The REST API (Django REST framework): clusters and hosts, jobs and their tasks, logs, metrics, artifacts,
experiments, webhooks, priority classes and who may use them, API tokens and sign-in limits, device usage, the
agents' join endpoint, and the OpenAPI schema's error answers. Thin: each view hands the work to the package that
owns it.

May import: contracts, core, limits, models, identity, objectstore, metrics, webhooks, jobs, scheduler, submit,
experiments, agents, insights, diagnosis, usage."""
