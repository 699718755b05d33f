"""`POST /api/agents/join/`: a host's agent asks for its configuration (contracts/join.py; `tfdash-agent join`).

No user signs in here: the request is a message sealed by the host's own key (contracts/signing.py; its token never
travels), checked like every agent message (orchestrator/identity/auth.py: MAC, age, nonce), and the answer, signed by
the control plane's key, holds nothing secret. Anything else gets one 403, the same for an unknown host and a wrong
key, so a prober learns nothing about which names exist.
"""

from __future__ import annotations

import logging

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from contracts.join import AGENT_JOIN
from orchestrator.agents import join
from orchestrator.identity import auth

log = logging.getLogger(__name__)


class JoinThrottle(AnonRateThrottle):
    """Per client address: a fleet joins once per host, so a burst of this size is a prober, not an admin."""

    rate = "60/min"


class AgentJoinView(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes = [JoinThrottle]

    @extend_schema(
        request={"application/json": {"type": "object", "description": "an agent message sealed by the host"}},
        responses={
            200: OpenApiResponse(description="the host's configuration, signed by the control plane"),
            403: OpenApiResponse(description="not a fresh join request sealed by a registered host's key"),
            409: OpenApiResponse(description="the host is on another machine and would be handed a loopback address"),
        },
    )
    def post(self, request: Request) -> Response:
        accepted = auth.authenticate(request.data, AGENT_JOIN)
        if accepted is None:
            return Response(
                {"detail": "Not a fresh join request sealed with a registered host's token (is the token file the "
                 "one the admin page showed for this host, and this machine's clock right?)."},
                status=status.HTTP_403_FORBIDDEN,
            )  # fmt: skip
        auth.remember(accepted)
        host = accepted.host
        body = accepted.message.body if isinstance(accepted.message.body, dict) else {}
        problem = join.unreachable_addresses(host)
        if problem:
            log.warning("host %s cannot join: %s", host.name, problem)
            return Response({"detail": problem}, status=status.HTTP_409_CONFLICT)
        log.info("host %s joined (agent %s)", host.name, str(body.get("agent_version", "?"))[:50])
        return Response(join.answer(host, accepted.message.protocol))
