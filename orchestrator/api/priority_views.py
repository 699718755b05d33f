"""GET /api/priority-classes/: every priority class and who may use it (orchestrator/scheduler/class_rights.py), the
rules the queue page shows, for scripts and `tfdash queue`."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.scheduler import class_rights


class PriorityClassRuleSerializer(serializers.Serializer):
    name = serializers.CharField()
    value = serializers.IntegerField(help_text="higher goes first")
    preemptible = serializers.BooleanField()
    is_default = serializers.BooleanField(help_text="the class of a job that names none")
    description = serializers.CharField()
    min_run_s = serializers.IntegerField(help_text="seconds its jobs run (from each placement) before a preemption")
    max_preemptions = serializers.IntegerField(
        allow_null=True,
        help_text="preempted this often within the window, a job is not preempted again (null: no bound)",
    )
    preemption_window_s = serializers.IntegerField(help_text="the bound's window in seconds")
    open_to_all = serializers.BooleanField(help_text="every user may submit at it (the default class always)")
    users = serializers.ListField(child=serializers.CharField(), help_text="users staff granted it to")
    groups = serializers.ListField(child=serializers.CharField(), help_text="groups whose members may use it")
    who = serializers.CharField(help_text="the rule in words (staff may use every class)")
    you_may_use = serializers.BooleanField(help_text="whether you may submit a job at this class")


class PriorityClassesView(APIView):
    @extend_schema(responses={200: PriorityClassRuleSerializer(many=True)})
    def get(self, request: Request) -> Response:
        """Every priority class, highest first, with who may submit at it."""
        return Response(PriorityClassRuleSerializer(class_rights.rules(request.user), many=True).data)
