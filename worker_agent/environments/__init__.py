"""Task environments on the agent: the list the control plane sends (contracts/environments.py AGENT_ENVIRONMENTS),
each interpreter probed as an unprivileged task uid from a fixed environment and cached per interpreter file
(known.py, probing.py), the results reported in HostFacts.environments, and a job's requirements file built into a
venv on top of its environment once per content (venvs.py). gpu_reason.py (the runtime's helper) says why an
environment's TensorFlow cannot use the host's GPUs.

Imports contracts and worker_agent.supervision (how a child runs as a task uid); never Django or the orchestrator.
"""
