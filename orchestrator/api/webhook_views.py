"""Webhooks over REST: a user's own (staff: also a whole cluster's); the secret is in the creation's answer alone."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from orchestrator.models import Cluster, Webhook, WebhookDelivery
from orchestrator.models.webhooks import notable_states
from orchestrator.webhooks import hooks

DELIVERY_LOG = 100


class WebhookSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all(), required=False,
                                           allow_null=True)  # fmt: skip
    events = serializers.ListField(child=serializers.CharField(max_length=40), required=False, max_length=20)

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "events", "cluster", "allow_private", "active", "created_at"]
        read_only_fields = ["id", "active", "created_at"]


class CreatedWebhookSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text="the HMAC-SHA256 key; shown in this answer only")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class DeliverySerializer(serializers.ModelSerializer):
    job = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = ["key", "event", "job", "state", "attempts", "last_status", "last_error", "next_attempt_at",
                  "created_at", "delivered_at"]  # fmt: skip


class WebhookViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    serializer_class = WebhookSerializer

    def get_queryset(self) -> QuerySet[Webhook]:
        if getattr(self, "swagger_fake_view", False):
            return Webhook.objects.none()
        return Webhook.objects.filter(owner=self.request.user).select_related("cluster")

    @extend_schema(
        request=WebhookSerializer,
        responses={201: CreatedWebhookSerializer},
        description=(
            f"Register a URL for job state changes ({', '.join(notable_states())}; default: succeeded, failed, "
            "cancelled). `cluster` (staff only): every job on it. `allow_private` (staff only): a private or "
            "loopback receiver. The answer carries `secret` once."
        ),
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        incoming = WebhookSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = incoming.validated_data
        hook, secret, errors = hooks.create(
            request.user,
            data["url"],
            events=data.get("events"),
            cluster=data.get("cluster"),
            allow_private=data.get("allow_private", False),
            name=data.get("name", ""),
        )
        if hook is None:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        body = CreatedWebhookSerializer(hook).data
        body["secret"] = secret
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: DeliverySerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        hook = self.get_object()
        return Response(DeliverySerializer(hook.deliveries.all()[:DELIVERY_LOG], many=True).data)
