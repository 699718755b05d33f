"""Taking back at once what a dead consumer had taken and never acknowledged, on Kombu's Redis transport.

Kombu's Redis channel keeps every message a consumer took and has not acknowledged in a hash (`QoS.unacked_key`,
"unacked" by default: delivery tag -> [message, exchange, routing key]) and puts them back on their queue only after
the visibility timeout (`QoS.restore_visible`). A worker that died (SIGKILL, power loss) would leave its messages
there that long; `restore_unacked` puts back those of the given queues now, through Kombu's own `restore_by_tag`
(Kombu 5.5.4), which a message being handled by another live consumer survives as a duplicate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kombu.utils.json import loads


def restore_unacked(connection: Any, queues: Iterable[str]) -> int:
    """Put back on their queue the unacknowledged messages routed to `queues`, on a Kombu `connection` of the Redis
    transport; returns how many. Another transport has no such hash: nothing is done (0)."""
    wanted = set(queues)
    channel = connection.default_channel
    qos = getattr(channel, "qos", None)
    if qos is None or not hasattr(qos, "restore_by_tag") or not wanted:  # not the Redis transport
        return 0
    client = channel.client
    restored = 0
    for tag, raw in client.hgetall(qos.unacked_key).items():
        try:
            _message, _exchange, routing_key = loads(raw)
        except (ValueError, TypeError):
            continue
        if routing_key in wanted:
            qos.restore_by_tag(tag, client)
            restored += 1
    return restored
