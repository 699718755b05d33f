"""The agent's process supervisor (supervisor.py) and what it is built from: checks and environment before a start
(launch.py), the command line and job folder (programs.py), the user a job runs as and the folders it owns
(identity.py), a task's output in numbered batches (output.py) and its
process group (processes.py)."""

from worker_agent.supervision.supervisor import Supervisor

__all__ = ["Supervisor"]
