from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.db.models import ProtectedError, QuerySet
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.api.permissions import IsStaffOrReadOnly
from orchestrator.api.serializers import (
    ClusterSerializer,
    HostCreatedSerializer,
    HostSerializer,
    QueueRowSerializer,
)
from orchestrator.identity import tokens
from orchestrator.models import Cluster, Host
from orchestrator.scheduler import queue_view


class ClusterViewSet(viewsets.ModelViewSet):
    queryset = Cluster.objects.prefetch_related("environments")
    serializer_class = ClusterSerializer
    permission_classes = [IsStaffOrReadOnly]

    @extend_schema(responses={200: QueueRowSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)
    def queue(self, request: Request, pk: str | None = None) -> Response:
        """The cluster's waiting jobs in the order the scheduler walks them, like `squeue --start`."""
        return Response(QueueRowSerializer(queue_view.rows(self.get_object(), request.user), many=True).data)

    @extend_schema(responses={204: None, 409: OpenApiResponse(description="the cluster still has jobs")})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        cluster = self.get_object()
        try:
            cluster.delete()
        except ProtectedError:
            return Response(
                {"detail": f"Cluster {cluster.name} has jobs; it cannot be deleted while they are kept."},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(status=status.HTTP_204_NO_CONTENT)


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
        token = tokens.issue(host)
        body = HostCreatedSerializer(host, context={**self.get_serializer_context(), "token": token}).data
        return Response(body, status=status.HTTP_201_CREATED)


@csrf_exempt  # it changes nothing, whatever the method
@login_not_required
def api_not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Anything under /api/ that matches no route: a JSON 404 like the API's own, not the HTML page."""
    return JsonResponse({"detail": "Not found."}, status=404)
