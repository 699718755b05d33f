from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.api.permissions import IsStaffOrReadOnly
from orchestrator.api.serializers import ClusterSerializer, HostCreatedSerializer, HostSerializer
from orchestrator.models import Cluster, Host


class ClusterViewSet(viewsets.ModelViewSet):
    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    permission_classes = [IsStaffOrReadOnly]


class HostViewSet(viewsets.ModelViewSet):
    """Hosts of one cluster. Registering a host returns its agent token, once."""

    serializer_class = HostSerializer
    permission_classes = [IsStaffOrReadOnly]

    def cluster(self) -> Cluster:
        return get_object_or_404(Cluster, pk=self.kwargs["cluster_pk"])

    def get_queryset(self) -> QuerySet[Host]:
        return Host.objects.filter(cluster_id=self.kwargs["cluster_pk"]).select_related("cluster")

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if "cluster_pk" in self.kwargs and self.request.method not in ("GET", "HEAD", "OPTIONS"):
            context["cluster"] = self.cluster()
        return context

    @extend_schema(responses={201: HostCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        host: Host = Host(cluster=self.cluster(), **serializer.validated_data)
        token = host.issue_token()
        host.save()
        body = HostCreatedSerializer(host, context={**self.get_serializer_context(), "token": token}).data
        return Response(body, status=status.HTTP_201_CREATED)
