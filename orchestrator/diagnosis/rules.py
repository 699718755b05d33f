"""The one table of verdict rules: which evidence makes a failure of which kind, and what to say about it.

Data, not a chain of ifs: classify.py tries the job-level rules (RULES with scope "job") against the job's end, then
each failed task against the task-level rules in table order, the first match winning (so the specific rows stand
before the general ones: a Keras 3 `ValueError` before any user exception, a ParameterServer `NotFoundError` on a
model saved under /tmp before a missing data file). Every criterion a rule names must hold (and); a regex searched in
a task's last log lines also lends its named groups to the templates.

Templates are `str.format` strings over the facts classify.py gathers (classify.FACT_KEYS): task (its label), host,
exc (the last exception's short name), msg (its message), where (the user's own frame, file:line), at_where
(" at file:line" or ""), how ("exit code 1", "signal 9 (SIGKILL)"), last (the last exception line, else the last log
line, else the agent's detail), code, reason (the job's), plus the rule's own named groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The kinds, in the order a reader meets them (surfaces may list them; every rule's kind is one of these).
KINDS = (
    "user_exception",
    "host_oom",
    "gpu_oom",
    "non_shared_path",
    "keras3_under_mwms_or_ps",
    "missing_import",
    "missing_file",
    "port_taken",
    "host_lost",
    "time_limit",
    "hang",
    "never_connected",
    "peer_failure",
    "stopped",
    "unknown",
)

MWMS, PS = "multi_worker_mirrored", "parameter_server"

# A SIGKILL nobody in the product sent: Python reports it as -9, a shell in between as 128 + 9.
SIGKILL_CODES = frozenset({-9, 137})

_JOB_DIR_HINT = (
    "Save under $TFDASH_JOB_DIR, the job's folder that every task sees, not under /tmp: e.g. working_dir = "
    "os.environ['TFDASH_JOB_DIR'] (or os.chdir to it and use relative paths); on a cluster without a shared folder, "
    "upload what you save to the cluster's object store."
)


_DATA_HINT = (
    "Put the data at that path on every host, in the cluster's shared folder, or under $TFDASH_JOB_DIR (a relative "
    "path starts in the task's own working directory)."
)


@dataclass(frozen=True)
class Rule:
    kind: str
    title: str
    message: str
    hint: str
    scope: str = "task"  # "task": judged per failed task; "job": by the job's end (its state, its reason)
    lines: str = ""  # a regex searched (multiline) in the task's last log lines
    detail: str = ""  # a regex searched in what the agent or the orchestrator said of the task's end
    reason: str = ""  # a regex searched in the job's end reason
    exit_codes: frozenset[int] = frozenset()
    task_states: frozenset[str] = frozenset()
    job_states: frozenset[str] = frozenset()
    strategies: frozenset[str] = frozenset()
    consequence: bool = False  # a failure caused by a peer's (or the product stopping it): never the cause if any
    compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        for name in ("lines", "detail", "reason"):
            if pattern := getattr(self, name):
                self.compiled[name] = re.compile(pattern, re.MULTILINE)


RULES: tuple[Rule, ...] = (
    # --- the job's end says it all --------------------------------------------------------------------------------
    Rule(
        "time_limit",
        scope="job",
        job_states=frozenset({"timed_out"}),
        title="time limit reached",
        message="The job ran into its time limit: {reason}; the product stopped its tasks.",
        hint="Raise the job's time limit, or train fewer epochs; its last checkpoint is kept, so 'Run again' resumes "
        "from it.",
    ),
    Rule(
        "hang",
        scope="job",
        reason=r"^no progress for (?P<seconds>\d+) s",
        title="no progress for {seconds} s: {task} stopped reporting first",
        message="The job made no progress for {seconds} s (no metric point or log line); {task} stopped reporting "
        "first, its last line: {last}",
        hint="Look at what {task} waits for after its last line (a peer that never comes, input that never ends, a "
        "lock); if it is only slow and silent, print a line per epoch or raise the job's progress timeout.",
    ),
    Rule(
        "never_connected",
        scope="job",
        reason=r"^not all tasks running and connected within (?P<seconds>\d+) s",
        title="{task} never connected",
        message="Not all tasks were running and connected within {seconds} s: {reason}",
        hint="A task whose TF server never listens waits forever for it: check that the script builds its strategy "
        "(which starts the server) before anything slow, and that its hosts can reach each other's ports.",
    ),
    # --- one task's own failure, specific rows first (a task the product stopped: the consequence rows only) --------
    Rule(
        "host_lost",
        task_states=frozenset({"lost"}),
        title="{task}'s host was lost",
        message="{task}'s host stopped answering ({detail}); its peers failed because of it.",
        hint="Check the host (power, network, its agent's log); the job restarts on the hosts left when its "
        "restart policy allows it (max_restarts > 0), resuming from its last checkpoint.",
    ),
    Rule(
        "port_taken",
        detail=r"port (?P<port>\d+) was taken",
        title="{task}'s port was taken",
        message="{task} could not use its port: {detail}",
        hint="Another process listens on that port of the host: stop it, or leave the host's port range to tfdash.",
    ),
    Rule(
        "port_taken",
        lines=r"Address already in use|Could not start gRPC server|Failed to add port to server",
        title="{task}'s port was taken",
        message="{task} could not listen on a port another process holds: {last}",
        hint="Listen only on the port TF_CONFIG gives this task (another process, or a second server in the script, "
        "holds this one); stop whatever holds it.",
    ),
    Rule(
        "keras3_under_mwms_or_ps",
        strategies=frozenset({MWMS, PS}),
        lines=r"Attempt to convert a value \(PerReplica|values\.PerReplica'>\) to a Tensor"
        r"|pass this dataset to ClusterCoordinator\.create_per_worker_dataset",
        title="{task}: Keras 3 fit under this strategy",
        message="{task} ran Keras 3's model.fit, which does not work under MultiWorkerMirrored or ParameterServer "
        "strategies: {last}",
        hint="Keep the job's legacy Keras on (TF_USE_LEGACY_KERAS=1) and use tf.keras (a plain `import keras` is "
        "Keras 3 whatever the setting), or write a custom loop with strategy.run.",
    ),
    Rule(
        "non_shared_path",
        strategies=frozenset({PS}),
        # The shards' folder TensorFlow names in the status line at the end of its message ("(0) NOT_FOUND: ...", or
        # the bare path), ~150 lines below the exception's name when a graph execution error lists its nodes.
        lines=r"(?P<path>/[^\s;:,'\"]*?)/variables(?:/variables)?_temp[^\n]*No such file or directory",
        title="{task}: model saved to a path the other tasks cannot see",
        message="{task} saved the model to {path}{at_where}, a path every task of a ParameterServer job resolves on "
        "its own host: the parameter servers' variable shards could not be gathered there.",
        hint=_JOB_DIR_HINT,
    ),
    Rule(
        "non_shared_path",
        strategies=frozenset({PS}),
        lines=r"(?:NotFoundError|NOT_FOUND)\b[^\n]*?(?P<path>/(?:tmp|var/tmp|dev/shm)/[^\s;:,'\"]+)",
        title="{task}: a path the other tasks cannot see",
        message="{task} used {path}{at_where}, a folder each task of a ParameterServer job has on its own host.",
        hint=_JOB_DIR_HINT,
    ),
    Rule(
        "gpu_oom",
        lines=r"ResourceExhaustedError|OOM when allocating tensor(?: with shape\s?(?P<shape>\[[^\]]*\]))?"
        r"(?:.*? on (?P<device>\S*device:\w+:\d+))?",
        title="{task} ran out of device memory",
        message="{task} ran out of device memory{at_where}: {msg}",
        hint="Lower the per-replica batch size (or the model's size), or spread the batch over more devices; "
        "TF_FORCE_GPU_ALLOW_GROWTH only changes when memory is taken, not how much there is.",
    ),
    Rule(
        "host_oom",
        lines=r"^MemoryError\b",
        title="{task} ran out of host memory",
        message="{task} ran out of host memory (MemoryError){at_where}.",
        hint="Use less memory per process (a smaller batch, shuffle buffer or cache(), no whole dataset in NumPy), "
        "or place fewer tasks on the host.",
    ),
    Rule(
        "host_oom",
        detail=r"(?i)oom[ _-]?kill|out of memory|memory\.events",
        title="{task} ran out of host memory",
        message="{task} was killed by the kernel for lack of host memory ({detail}).",
        hint="Use less memory per process (a smaller batch, shuffle buffer or cache()), or place fewer tasks on the "
        "host.",
    ),
    Rule(
        "host_oom",
        exit_codes=SIGKILL_CODES,
        task_states=frozenset({"failed"}),
        detail=r"^$",  # the product sent no kill (it would have said why)
        title="{task} was killed (out of host memory?)",
        message="{task} was killed by SIGKILL ({how}) that the product did not send: the kernel's OOM killer does "
        "this when the host runs out of memory.",
        hint="Check the host's kernel log (dmesg: 'Out of memory: Killed process') or its cgroup's memory.events; "
        "use less memory per process (a smaller batch, shuffle buffer or cache()) or place fewer tasks on the host.",
    ),
    Rule(
        "missing_import",
        lines=r"^ModuleNotFoundError: No module named '(?P<module>[^']+)'",
        title="{task}: no module named {module}",
        message="{task} could not import {module}{at_where}: the job's environment on {host} lacks it.",
        hint="Install the package in the job's environment on every host (or pick an environment that has it), "
        "or ship the module beside the script.",
    ),
    Rule(
        "missing_import",
        lines=r"^(?:ModuleNotFoundError|ImportError): ",
        title="{task}: import failed ({exc})",
        message="{task} failed to import{at_where}: {msg}",
        hint="Install the versions the script expects in the job's environment on every host (or pick an "
        "environment that has them).",
    ),
    Rule(
        "missing_file",
        lines=r"^(?:FileNotFoundError|IsADirectoryError): .*?'(?P<path>[^']+)'",
        title="{task}: file not found",
        message="{task} could not find {path}{at_where} on {host}.",
        hint=_DATA_HINT,
    ),
    Rule(
        "missing_file",
        lines=r"(?:NotFoundError|NOT_FOUND)[\s\S]{0,400}?(?P<path>/[^\s;:'\"]+)[;:]? No such file or directory",
        title="{task}: file not found",
        message="{task} could not find {path}{at_where} on {host}.",
        hint=_DATA_HINT,
    ),
    Rule(
        "peer_failure",
        lines=r"UnavailableError|CancelledError|AbortedError|Collective ops is aborted|failed to connect to all "
        r"addresses|Socket closed|Connection reset by peer|DEADLINE_EXCEEDED|is not available|has been aborted",
        consequence=True,
        title="{task} lost a peer",
        message="{task} failed because a peer did: {last}",
        hint="Look at the cause task; this one failed after it.",
    ),
    Rule(
        "stopped",
        task_states=frozenset({"killed"}),
        consequence=True,
        title="{task} was stopped",
        message="{task} was stopped by the product after the job's end was decided ({detail}).",
        hint="Nothing to fix in this task.",
    ),
    Rule(
        "user_exception",
        lines=r"^Traceback \(most recent call last\):",
        title="{task} raised {exc}",
        message="{task} raised {exc}{at_where}: {msg}",
        hint="Fix the error{at_where} (the traceback is in the task's log); the other tasks stopped because of it.",
    ),
    Rule(
        "unknown",
        title="{task} failed ({how})",
        message="{task} failed ({how}); its last words: {last}",
        hint="Read the task's log; the verdict has no rule for this failure yet.",
    ),
)

JOB_RULES = tuple(rule for rule in RULES if rule.scope == "job")
TASK_RULES = tuple(rule for rule in RULES if rule.scope == "task")
CONSEQUENCES = frozenset(rule.kind for rule in RULES if rule.consequence)
