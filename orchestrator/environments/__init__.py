"""Task environments on the control plane: which hosts can run which environment (availability.py), what a job's
submission is refused for, telling the agents the cluster's environments (orders.py), and staff's admin page
(admin.py). The model is orchestrator/models/environments.py; the rules both sides share, contracts/environments.py.

May import: contracts, models, plumbing, identity. Imported by the scheduler, submit, agents (the hello) and the
admin."""
