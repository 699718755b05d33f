"""The stream readers' doorbell (orchestrator/plumbing/doorbell.py), against real Redis: a host's add to a stream of
the bell's kind rings it, nothing else does (another kind, the readers' own deletes); a reader with a live bell reads
an add at once though it would not poll for a minute; notifications are turned on by a user that may, found on when
an operator set them, and left to polling when neither; a Redis restarted without them has them turned on again."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from contracts import broker
from orchestrator.plumbing import doorbell, streams
from tests.support.processes import wait_until
from tests.support.redis_server import RedisServer

SETTING = "notify-keyspace-events"


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    """Set at the end of the test, whose bells and readers are then waited for: none logs after its test."""
    before = set(threading.enumerate())
    event = threading.Event()
    yield event
    stop_all(event, before)


def stop_all(stop: threading.Event, before: set[threading.Thread]) -> None:
    """Set `stop` and wait for the bells and readers started since `before` (not a server's output reader, which ends
    with its process)."""
    stop.set()
    for thread in set(threading.enumerate()) - before:
        if not thread.name.startswith("read-"):  # tests/support/processes.py ManagedProcess
            thread.join(10)


@pytest.fixture
def hosts(redis_url: str) -> Iterator[list[str]]:
    names = [f"d-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    yield names
    client = redis.Redis.from_url(redis_url)
    client.delete(*(broker.stream(name, kind) for name in names for kind in broker.STREAM_KINDS))


def live_bell(client: redis.Redis, kind: str, stop: threading.Event) -> doorbell.Doorbell:
    bell = doorbell.Doorbell(client, kind)
    bell.start(stop)
    wait_until(lambda: bell.live, 20, what="the bell subscribed")
    return bell


def test_an_add_to_a_stream_of_its_kind_rings_and_nothing_else_does(redis_url, hosts, stop):
    client = redis.Redis.from_url(redis_url)
    bell = live_bell(client, broker.EVENTS, stop)
    bell.heard.clear()
    rung = bell.rings()

    client.xadd(broker.stream(hosts[0], broker.METRICS), {"name": "another kind"})
    first = client.xadd(broker.stream(hosts[0], broker.EVENTS), {"name": "one"})
    client.xdel(broker.stream(hosts[0], broker.EVENTS), first)  # as a reader deletes what it acknowledged
    client.xadd(broker.stream(hosts[1], broker.EVENTS), {"name": "two"})

    assert bell.wait(rung, 20)
    # Pub/sub keeps the order of the commands: once the last add was heard, everything before it was too.
    last = (broker.stream(hosts[1], broker.EVENTS), "xadd")
    wait_until(lambda: last in bell.heard, 20, what="the last add heard")
    mine = [each for each in bell.heard if broker.host_of_key(each[0]) in hosts]
    assert mine == [(broker.stream(hosts[0], broker.EVENTS), "xadd"), (broker.stream(hosts[0], broker.EVENTS), "xdel"),
                    last]  # fmt: skip
    assert bell.rings() - rung == sum(1 for _key, event in bell.heard if event == "xadd")  # the delete rang nothing


def test_a_reader_with_a_live_bell_reads_an_add_at_once_though_it_would_not_poll_for_a_minute(
    redis_url, hosts, stop, monkeypatch
):
    monkeypatch.setattr(doorbell, "SAFETY_S", 60.0)
    client = redis.Redis.from_url(redis_url)
    seen: list[bytes] = []

    def handler(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        seen.extend(entry.fields[b"name"] for entry in entries)
        return []

    reader = streams.StreamReader(client, kind=broker.EVENTS, group="bell-test", consumer="c", handler=handler,
                                  hosts=lambda: hosts, idle_s=60.0, wake_on_add=True)  # fmt: skip
    reader.ensure_groups()
    threading.Thread(target=reader.run, args=(stop,), daemon=True).start()
    wait_until(lambda: reader.bell is not None and reader.bell.live, 20, what="the reader's bell live")

    for number in range(3):  # each after the reader went back to waiting
        client.xadd(broker.stream(hosts[number % 2], broker.EVENTS), {"name": f"e{number}"})
        wait_until(lambda n=number: len(seen) == n + 1, 20, what=f"entry {number} read")
    assert seen == [b"e0", b"e1", b"e2"]


def test_notifications_are_turned_on_by_a_user_that_may_and_heard_by_one_that_may_not_look(redis_url, stop):
    admin = redis.Redis.from_url(redis_url)
    setting = admin.config_get(SETTING)[SETTING]
    pool = admin.connection_pool.connection_kwargs
    users: dict[str, redis.Redis] = {}
    for label, rule in (("no-set", "-config|set"), ("blind", "-config")):  # may look but not set; may do neither
        name, password = f"{label}-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        admin.acl_setuser(name, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"],
                          commands=["+@all", rule])  # fmt: skip
        users[label] = redis.Redis(host=pool["host"], port=pool["port"], db=pool.get("db", 0), username=name,
                                   password=password)  # fmt: skip
    host = f"d-{uuid.uuid4().hex[:8]}"
    before = set(threading.enumerate())
    try:
        admin.config_set(SETTING, "")
        assert doorbell.enable_notifications(users["no-set"]) is False  # off for good: its readers poll
        assert doorbell.enable_notifications(users["blind"]) is None  # unknown: they poll until an add is heard
        assert admin.config_get(SETTING)[SETTING] == ""

        admin.config_set(SETTING, "Ex")  # an operator's flags of their own are kept
        assert doorbell.enable_notifications(admin)
        assert set(admin.config_get(SETTING)[SETTING]) >= set("ExKt")

        admin.config_set(SETTING, "AK")  # `A` holds `t`; set by an operator
        assert doorbell.enable_notifications(users["no-set"])
        assert admin.config_get(SETTING)[SETTING] == "AK"
        bell = doorbell.Doorbell(users["blind"], broker.EVENTS)
        bell.start(stop)

        def heard() -> bool:  # live once a notification was heard
            admin.xadd(broker.stream(host, broker.EVENTS), {"name": "probe"})
            return bell.live

        wait_until(heard, 20, what="the bell live on a notification heard")
    finally:
        stop_all(stop, before)  # before its user goes, which closes the bell's connection
        admin.config_set(SETTING, setting)
        for user in users.values():
            admin.acl_deluser(user.connection_pool.connection_kwargs["username"])
        admin.delete(broker.stream(host, broker.EVENTS))


def test_a_redis_restarted_without_notifications_has_them_turned_on_again(tmp_path: Path, stop):
    before = set(threading.enumerate())
    server = RedisServer(tmp_path)
    server.start()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        bell = live_bell(client, broker.EVENTS, stop)
        server.kill()
        server.start()  # without notifications, as a Redis without its configuration file

        def rings_again() -> bool:
            rung = bell.rings()
            client.xadd(broker.stream("restarted", broker.EVENTS), {"name": "after"})
            return bell.live and bell.wait(rung, 0.5) and "K" in client.config_get(SETTING)[SETTING]

        wait_until(rings_again, 30, what="the bell ringing on the restarted Redis")
    finally:
        stop_all(stop, before)  # before its Redis goes: no log line after the test
        server.kill()


def test_an_add_by_a_host_registered_since_the_reader_read_its_host_list_is_read_at_once(
    redis_url, hosts, stop, monkeypatch
):
    """A new agent's hello is applied at once, before its heartbeats mark it online: the reader does not wait for its
    next host-list refresh (here a minute away, as is its next read but for a ring)."""
    monkeypatch.setattr(doorbell, "SAFETY_S", 60.0)
    monkeypatch.setattr(streams, "HOSTS_REFRESH_S", 60.0)
    client = redis.Redis.from_url(redis_url)
    registered = hosts[:1]
    seen: list[tuple[str, bytes]] = []

    def handler(entries: list[streams.Entry]) -> list[tuple[streams.Entry, Exception]]:
        seen.extend((entry.host, entry.fields[b"name"]) for entry in entries)
        return []

    reader = streams.StreamReader(client, kind=broker.EVENTS, group="bell-test", consumer="c", handler=handler,
                                  hosts=lambda: list(registered), idle_s=60.0, wake_on_add=True)  # fmt: skip
    reader.ensure_groups()
    threading.Thread(target=reader.run, args=(stop,), daemon=True).start()
    wait_until(lambda: reader.bell is not None and reader.bell.live, 20, what="the reader's bell live")

    registered.append(hosts[1])
    client.xadd(broker.stream(hosts[1], broker.EVENTS), {"name": "hello"})

    wait_until(lambda: seen, 20, what="the new host's entry read")
    assert seen == [(hosts[1], b"hello")]
