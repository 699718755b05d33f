"""Issue 42: no job's environment reaches a process running as root (worker_agent/supervision/mount_ns.py).

With the agent as root, with task uids and a mount namespace per task (as `make run` and CI start it), a task starts
as `python -I -S mount_ns.py`, root until it drops to the job's uid. glibc reads GCONV_PATH, LOCPATH, LC_ALL,
LD_DEBUG_OUTPUT and GLIBC_TUNABLES while any process starts, before Python could ignore anything: a job naming a gconv
module its user planted ran that module's code as uid 0, and LD_DEBUG_OUTPUT had root create files at a path the user
chose. Here a user plants both where any job may write (the cluster's shared folder), submits a real job naming them,
and no code of theirs runs as root, no file is made by root: the module runs, and the files are made, as the job's uid
only (which shows the plant works, so "not as root" is not "never tried"). ld.so makes LD_DEBUG_OUTPUT's file for
every process that starts with it, owned by the uid that process starts as (root is not AT_SECURE): so "no file of
root's" covers every process the agent starts with the job's variables over the job's whole life on the host, not
only the launcher.

Real orchestrator, a real agent as root with --task-uids, a real job; the module is compiled with gcc here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from orchestrator.models import Host, HostStatus
from tests import factories
from tests.orchestrator.test_jobs_e2e import log_text, submit, wait_for_job
from tests.support.processes import wait_until
from tests.support.task_uids import TASK_UIDS
from worker_agent.supervision.identity import parse_range

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(os.geteuid() != 0, reason="tasks drop from root to their job's uid only as root (CI is)"),
    pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("localedef")), reason="needs gcc and localedef"),
]

PRIVATE = "tasks get their own /tmp, /dev/shm and /proc"
TUNABLES = "glibc.malloc.perturb=0"
# Its constructor runs when glibc loads it (dlopen, as the locale's charset is looked up): one file per process, named
# by pid, saying who it ran as and whether GLIBC_TUNABLES, set beside GCONV_PATH, was in that process's environment.
MODULE_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    char path[4096], line[512];
    const char *tunables = getenv("GLIBC_TUNABLES");
    snprintf(path, sizeof path, "%s/ran.%d", RECORDS, (int)getpid());
    int n = snprintf(line, sizeof line, "{\"uid\": %d, \"euid\": %d, \"tunables\": \"%s\"}",
                     (int)getuid(), (int)geteuid(), tunables ? tunables : "");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) { write(fd, line, n); close(fd); }
}
int gconv_init(void *step) { return 1; }
int gconv(void *a, void *b, const unsigned char **c, const unsigned char *d, unsigned char **e, size_t *f, int g,
          int h) { return 1; }
"""


@dataclass(frozen=True)
class Plant:
    env: dict[str, str]  # what the job names
    records: Path  # ran.<pid>: the module's code ran in that process
    debug: Path  # LD_DEBUG_OUTPUT's files, out.<pid>


@pytest.fixture
def api(alice) -> APIClient:  # type: ignore[no-untyped-def]
    """The REST API as alice, a user without staff rights (tests/conftest.py)."""
    client = APIClient()
    client.force_authenticate(alice)
    return client


def plant_in(folder: Path) -> Plant:
    """A gconv module, the `gconv-modules` file naming it for charset EVIL, and a locale `xx` of that charset: what
    any user can make and leave where a job can read it."""
    kit, records, debug = folder / "kit", folder / "records", folder / "debug"
    for each in (kit / "locales", records, debug):
        each.mkdir(parents=True)
    for each in (records, debug):
        each.chmod(0o1777)  # written by whichever process runs the plant, root or the job's uid
    source = kit / "evil.c"
    source.write_text(MODULE_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DRECORDS="{records}"', "-o", str(kit / "evil.so"), str(source)], check=True
    )
    (kit / "gconv-modules").write_text("module EVIL// INTERNAL evil 1\nmodule INTERNAL EVIL// evil 1\n")
    charmap = ["<code_set_name> EVIL", "CHARMAP", *(f"<U{i:04X}> /x{i:02x}" for i in range(128)), "END CHARMAP"]
    (kit / "evil.charmap").write_text("\n".join(charmap) + "\n")
    (kit / "xx.def").write_text("LC_CTYPE\nEND LC_CTYPE\n")
    # -c: a locale with only LC_CTYPE defined is written anyway (localedef then exits 1 for its warnings).
    made = subprocess.run(
        ["localedef", "-c", "-f", str(kit / "evil.charmap"), "-i", str(kit / "xx.def"), str(kit / "locales" / "xx")],
        capture_output=True,
        text=True,
    )
    assert (kit / "locales" / "xx" / "LC_CTYPE").exists(), made.stderr
    for path in [folder, *folder.rglob("*")]:
        if path not in (records, debug):
            path.chmod(0o755 if path.is_dir() else 0o644)
    env = {
        "GCONV_PATH": str(kit),
        "LOCPATH": str(kit / "locales"),
        "LC_ALL": "xx",
        "LD_DEBUG": "files",
        "LD_DEBUG_OUTPUT": str(debug / "out"),
        "GLIBC_TUNABLES": TUNABLES,
    }
    return Plant(env, records, debug)


def ran(plant: Plant) -> list[dict[str, int | str]]:
    return [json.loads(path.read_text()) for path in sorted(plant.records.glob("ran.*"))]


def debug_owners(plant: Plant) -> dict[str, int]:
    return {path.name: path.stat().st_uid for path in plant.debug.iterdir()}


def test_a_jobs_planted_gconv_module_and_ld_debug_output_never_act_as_root(api, orchestrator, start_agent, open_tmp):
    host, token = factories.host("planted-0", port_min=29820)
    Host.objects.filter(pk=host.pk).update(port_max=29829, cpu_slots=2)
    agent = start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, 30, what="the host online")
    assert PRIVATE in agent.output()  # the launcher (mount_ns.py) is in the task's path: the case of the issue
    # Where a job of this user could have written it: the cluster's shared folder, which every task of theirs reaches.
    plant = plant_in(open_tmp / "shared" / "planted")

    job = wait_for_job(submit(api, "exits_3.py", strategy="mirrored", workers=1, env=json.dumps(plant.env)))

    [task] = job.current_tasks()
    # The plant works: the task's Python loaded the module (and died of its charset, which Python cannot decode).
    records = wait_until(lambda: ran(plant), 30, what="the planted module to run in the task")
    owners = wait_until(lambda: debug_owners(plant), 30, what="ld.so's debug output of the task")
    assert job.state == "failed", (job.state, job.reason, log_text(task))
    # Never as root: not the module's code, nor a file at LD_DEBUG_OUTPUT's path; GLIBC_TUNABLES was beside them.
    as_root = {
        "the module ran as root": [r for r in records if r["uid"] == 0 or r["euid"] == 0],
        "root made these at LD_DEBUG_OUTPUT": sorted(name for name, uid in owners.items() if uid == 0),
    }
    assert as_root == {"the module ran as root": [], "root made these at LD_DEBUG_OUTPUT": []}
    job_uids = {r["uid"] for r in records}
    assert len(job_uids) == 1 and next(iter(job_uids)) in parse_range(TASK_UIDS), records  # the job's own
    assert set(owners.values()) == job_uids
    assert {r["tunables"] for r in records} == {TUNABLES}
