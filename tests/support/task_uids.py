"""Which task uids the tests use: ranges that never overlap, so no test's agent or uid pool reaches another's processes.

An agent running as root kills every process of a uid in its `--task-uids` range that no agent of this machine holds:
at start-up (`TaskUids.sweep`) and before the uid serves a job (`TaskUids._claim`). That is the product's rule for
what a dead agent left behind, and on one machine running two test workers it reaches across them: a test that kills
its agent on purpose leaves an orphan whose uid no agent holds, and a Supervisor or pool another test built in the
meantime with a range holding that uid killed it (CI: `test_an_agent_back_after_its_host_was_declared_lost_still_
kills_the_orphan` found its orphan gone). Hence one layout:

- 20000-29999: `make run`'s own range (scripts/local_stack.py LOCAL_TASK_UIDS), used only by the test that runs it;
- 30000-39999: single tests' fixed uids and small ranges, each a test module's own (30100-30111 test_identity,
  30200-30299 its Supervisor, 30300-30399 test_launcher_env, 30400 test_folders, 30500-30509 test_tensorboard_dir,
  30600-30601 test_cluster_uids, 30700-30701 test_cluster_uids_e2e, 30800 test_task_leftovers_e2e, 30975
  test_uid_leftovers, 30977 test_uid_pool);
- 40000 + 5000 N to 44999 + 5000 N: the agents of pytest-xdist worker gwN (`TASK_UIDS`).
"""

from __future__ import annotations

import os

from tests.support.workers import WORKER

# As in CI (root): test agents run each job's tasks under a uid of its own. Empty when not root.
TASK_UIDS = f"{40000 + 5000 * WORKER}-{44999 + 5000 * WORKER}" if os.geteuid() == 0 else ""
