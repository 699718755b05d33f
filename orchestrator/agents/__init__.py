"""What hosts send, applied on the control plane: hello and heartbeat reports (reports.py, heartbeats.py), task
events (events.py, intake.py), host liveness (the watchdog's view of hosts), reconciling what an agent says runs
(reconcile.py), and a host's join (join.py). Who sent a message is identity/'s; what a task reports of its training
is metrics/'.

May import: contracts, core, models, plumbing, identity, environments, jobs."""
