"""The agent's process supervisor (supervisor.py) and what it is built from: checks and environment before a start
(launch.py), the command line and job folder (programs.py), the user a job runs as and the folders it owns
(identity.py), a task's output from its files in numbered batches (output.py; a long line of progress-bar redraws
folded as it grows, output_lines.py), its metrics pipe (metrics_pipe.py), its process group (processes.py), the
kernel's word on a SIGKILL it did not send (oom_evidence.py), what the agent keeps across its own restarts
(records.py: the processes it started; ledger.py: launches taken, exits until acknowledged, its event clock). The
outbox (worker_agent/outbox.py) stays beside the app: it carries every report of the agent's, not only its tasks'."""

from worker_agent.supervision.supervisor import Supervisor

__all__ = ["Supervisor"]
