"""GET /api/usage/: device-seconds per day and account (user, group or cluster) for a period of UTC days, with each
account's totals and, where staff priced the cluster, its showback cost (orchestrator/usage/). Staff read everyone's;
a user their own and their groups'."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.usage import asking, periods, reads, scopes


class UsageDaySerializer(serializers.Serializer):
    day = serializers.DateField(help_text="a UTC day")
    account = serializers.CharField(help_text="the user's, group's or cluster's name")
    kind = serializers.CharField(help_text="gpu or cpu")
    device_seconds = serializers.FloatField(help_text="devices held x seconds, ended and running tasks")
    running_seconds = serializers.FloatField(help_text="of which tasks still running (so far)")
    cost = serializers.FloatField(allow_null=True, help_text="device-hours x the cluster's price (showback)")


class UsageAccountSerializer(serializers.Serializer):
    account = serializers.CharField()
    device_seconds = serializers.FloatField()
    device_hours = serializers.FloatField()
    running_seconds = serializers.FloatField()
    by_kind = serializers.DictField(child=serializers.FloatField(), help_text="device-seconds per kind")
    cost = serializers.FloatField(allow_null=True)


class UsageSerializer(serializers.Serializer):
    """The answer's shape, for the schema: `body` writes it (a serializer per row cost seconds at 30,000 rows)."""

    to = serializers.DateField(help_text="the last UTC day, inclusive")
    by = serializers.CharField()
    generated_at = serializers.DateTimeField()
    device_seconds = serializers.FloatField(help_text="the period's total, every account shown")
    accounts = UsageAccountSerializer(many=True, help_text="each account's totals, most used first")
    days = UsageDaySerializer(many=True, help_text="per day, account and kind, in no particular order")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = serializers.DateField(help_text="the first UTC day")  # a keyword: no attribute can say it
        return fields


def body(report: reads.Report) -> dict[str, Any]:
    """The answer to GET /api/usage/, in UsageSerializer's shape."""
    return {
        "from": report.query.start.isoformat(),
        "to": report.query.end.isoformat(),
        "by": report.query.by,
        "generated_at": report.generated_at.isoformat().replace("+00:00", "Z"),
        "device_seconds": report.device_seconds,
        "accounts": [
            {
                "account": a.account,
                "device_seconds": a.device_seconds,
                "device_hours": a.device_hours,
                "running_seconds": a.running_seconds,
                "by_kind": a.by_kind,
                "cost": a.cost,
            }
            for a in report.accounts
        ],
        "days": [
            {
                "day": day.isoformat(),
                "account": account,
                "kind": kind,
                "device_seconds": seconds,
                "running_seconds": running,
                "cost": cost,
            }
            for day, account, kind, seconds, running, cost in report.rows
        ],
    }


class UsageView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("from", str, description="first UTC day, YYYY-MM-DD (default: 29 days before `to`)"),
            OpenApiParameter(
                "to", str, description=f"last UTC day, inclusive (default: today; {periods.MAX_DAYS} at most)"
            ),
            OpenApiParameter(
                "by", str, enum=list(periods.BY), description="group per user (default), group or cluster"
            ),
            OpenApiParameter("user", str, description="only this user's usage"),
            OpenApiParameter("group", str, description="only this group's members' usage"),
            OpenApiParameter("cluster", str, description="only this cluster's usage (by name)"),
        ],
        responses={
            200: UsageSerializer,
            400: OpenApiResponse(description="a bad parameter: {field: [message]}"),
            403: OpenApiResponse(description="another user's or group's usage"),
        },
    )
    def get(self, request: Request) -> Response:
        """Device-seconds per day and account: ended tasks from the daily rollup, running ones so far."""
        try:
            report = asking.ask(request.user, request.query_params, timezone.now())
        except periods.BadQuery as exc:
            return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
        except scopes.NotYours as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        return Response(body(report))
