from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from orchestrator.api.experiment_serializers import (
    ExperimentDetailSerializer,
    ExperimentInputSerializer,
    ExperimentSerializer,
)
from orchestrator.experiments import actions as experiments
from orchestrator.models import Experiment, Job


class ExperimentViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Compare-strategies experiments: the user's own (staff: all); anyone else's answers 404."""

    serializer_class = ExperimentSerializer
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[Experiment]:
        if getattr(self, "swagger_fake_view", False):
            return Experiment.objects.none()
        jobs = Prefetch("jobs", queryset=Job.objects.only("pk", "experiment_id", "variant", "state"))
        return Experiment.objects.visible_to(self.request.user).prefetch_related(jobs)

    def get_serializer_class(self) -> type[BaseSerializer]:
        return ExperimentDetailSerializer if self.action in ("retrieve", "cancel") else ExperimentSerializer

    @extend_schema(
        request={"application/json": ExperimentInputSerializer, "multipart/form-data": ExperimentInputSerializer},
        responses={201: ExperimentDetailSerializer},
        description=(
            "Start an experiment: the same program and hyperparameters under each variant's strategy and shape, each "
            "run an ordinary job. Every variant is checked up front (a 400 names the variant)."
        ),
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        incoming = ExperimentInputSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        experiment = incoming.build_experiment(request.user)
        return Response(ExperimentDetailSerializer(experiment).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None, responses={200: ExperimentDetailSerializer, 409: OpenApiResponse(description="already ended")}
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        experiment = self.get_object()
        if not experiments.cancel(experiment.pk, by=request.user.get_username()):
            return Response(
                {"detail": f"The experiment has ended ({experiments.state_of(experiment)})."},
                status=status.HTTP_409_CONFLICT,
            )
        experiment.refresh_from_db()
        return Response(ExperimentDetailSerializer(experiment).data)
