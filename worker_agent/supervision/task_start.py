"""Starting a task's process: the supervisor's launching half.

A launch claims its (task, attempt) slot once however often it is delivered, is refused when its port is held,
prepares the task's place in the workspace (its uid, folders, private /tmp, requirements venv), restores the job's
last checkpoint from the object store when the cluster has one, and starts the process in its own process group with
its output going to files and its metrics to a pipe.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import tarfile

from contracts.store import StoreUrls, store_urls_from
from contracts.task_messages import LaunchSpec, TaskEventKind
from contracts.task_wire import METRICS_FD_ENV
from worker_agent.supervision import programs
from worker_agent.supervision.checkpoint_upload import CheckpointUploader
from worker_agent.supervision.launch import Refused, check_port
from worker_agent.supervision.metrics_pipe import MetricsPipe
from worker_agent.supervision.output import TaskLogs
from worker_agent.supervision.store_http import ArtifactSlots, StoreError
from worker_agent.supervision.supervisor_state import Child, SupervisorState
from worker_agent.supervision.workspace import Prepared

log = logging.getLogger(__name__)

STORE_SCRATCH = "store-tmp"  # under the workdir: checkpoint tars on their way to or from the object store


class TaskStarting(SupervisorState):
    # --- launching --------------------------------------------------------------------------------------------
    def _reserve(self, spec: LaunchSpec) -> Child | None:
        """Claim the (task, attempt) slot so two deliveries of one launch cannot both start a process."""
        key = (spec.task_id, spec.attempt)
        with self._lock:
            if self._closing:
                raise Refused(TaskEventKind.LAUNCH_FAILED, "the agent is shutting down")
            if key in self._children or not self.ledger.accept(spec.job_id, *key):
                # Sent again (the orchestrator had not heard of it yet) or redelivered: applied once. What became of
                # the first one reaches the orchestrator by its events and the heartbeat.
                log.info("dropping a repeated launch of task %s attempt %s", *key)
                return None
            holder = next(
                (c for c in self._children.values() if spec.port is not None and c.spec.port == spec.port), None
            )
            if holder is not None:
                self.ledger.forget(*key)
                raise Refused(
                    TaskEventKind.PORT_CONFLICT,
                    f"port {spec.port} is held by task {holder.spec.task_id} attempt {holder.spec.attempt}",
                )
            child = Child(spec=spec, logs=TaskLogs(spec.task_id, spec.attempt, self._send, self.output))
            self._children[key] = child
            return child

    def _release(self, child: Child) -> None:
        """A launch refused before its process started: forgotten, so the same order sent again is judged again."""
        with self._lock:
            self._children.pop((child.spec.task_id, child.spec.attempt), None)
            self.ledger.forget(child.spec.task_id, child.spec.attempt)
        self._leave(child)
        child.done.set()

    def _start(self, spec: LaunchSpec, child: Child) -> tuple[subprocess.Popen[bytes], MetricsPipe]:
        base, python = programs.interpreter_for(spec, self.venvs)
        program = dataclasses.replace(
            programs.load(spec.program), interpreter=python, installations=programs.installations(base, python)
        )
        if spec.port is not None:
            check_port(spec.port)
        prepared = self.workspace.prepare(spec, program)
        child.placed, child.uid = True, prepared.uid
        urls = store_urls_from(spec.store)
        # With a shared folder the checkpoints are there for every host already: only artifacts use the store.
        follows = urls is not None and not spec.job_dir and prepared.job_place is not None
        named = self._restore(spec, urls, prepared) if follows and urls is not None else None
        child.slots = ArtifactSlots(urls.artifact_put) if urls is not None else None
        metrics = MetricsPipe(
            spec.task_id,
            spec.attempt,
            self._send,
            owner=prepared.uid,
            artifacts_from=prepared.artifacts_from,
            store_slots=child.slots,
        )
        output: dict[str, int] = {}
        try:
            prepared.env[METRICS_FD_ENV] = str(metrics.write_fd)
            child.tensorboard = prepared.tensorboard
            # Files, not pipes: the task's prints never block on, or die with, this agent (output.py).
            output = self.output.create(spec.task_id, spec.attempt)
            child.logs.open()
            if spec.requirements and self.venvs is not None:  # its build's lines are the task's first output
                self.venvs.ensure(base, spec.requirements, output["stdout"])
            # Through the launcher (root): a fixed environment, the task's on stdin (workspace.Prepared).
            with prepared.process_start() as (env, stdin):
                proc = subprocess.Popen(
                    prepared.argv,
                    cwd=prepared.cwd,
                    env=env,
                    stdin=stdin,
                    stdout=output["stdout"],
                    stderr=output["stderr"],
                    pass_fds=(metrics.write_fd,),
                    start_new_session=True,  # its own process group: one killpg stops it and everything it spawned
                    **prepared.popen,
                )
        except BaseException:
            metrics.discard()
            child.logs.discard()
            self.output.remove(spec.task_id, spec.attempt)
            raise
        finally:
            for fd in output.values():
                os.close(fd)
        # Only the child (and what it passes the fd on to) may hold the write end, or the reader never sees EOF.
        metrics.child_started()
        if follows and urls is not None and urls.uploads_checkpoints and prepared.job_place is not None:
            label = f"task {spec.task_id} attempt {spec.attempt}"
            child.uploader = CheckpointUploader(
                urls, prepared.job_place, prepared.uid, self.workdir / STORE_SCRATCH, label, named
            )
            child.uploader.start()
        return proc, metrics

    def _restore(self, spec: LaunchSpec, urls: StoreUrls, prepared: Prepared) -> str | None:
        """The store's last checkpoint unpacked into the job's folder here (checkpoint_restore.Restores); refused when
        the store has one that cannot be had: starting over would then overwrite it with an earlier one."""
        assert prepared.job_place is not None
        scratch = self.workdir / STORE_SCRATCH
        try:
            return self._restores.once(spec.job_id, spec.attempt, urls, prepared.job_place, prepared.uid, scratch)
        except (StoreError, OSError, tarfile.TarError) as exc:
            raise Refused(
                TaskEventKind.LAUNCH_FAILED, f"could not restore the job's checkpoint from the object store: {exc}"
            ) from None
