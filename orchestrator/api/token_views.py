"""API tokens over the API: `POST /api/token/` signs in and issues one (what `tfdash login` calls), `GET /api/tokens/`
lists the caller's own, `DELETE /api/tokens/<id>/` revokes one of them, and `DELETE /api/tokens/current/` revokes
the token the request came with (what `tfdash logout` calls)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.api import signin_limit
from orchestrator.identity import api_tokens
from orchestrator.models import ApiToken


class SignInSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False, style={"input_type": "password"})
    name = serializers.CharField(
        max_length=api_tokens.NAME_MAX, required=False, allow_blank=True, help_text="what to call this token (device)"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # authenticate() sends user_login_failed on a wrong password, which the sign-in limits count.
        user = authenticate(request=self.context["request"], username=attrs["username"], password=attrs["password"])
        if user is None:
            raise serializers.ValidationError("Unable to log in with provided credentials.", code="authorization")
        attrs["user"] = user
        return attrs


class IssuedTokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="send as `Authorization: Token <token>`; shown this once")
    id = serializers.IntegerField()
    name = serializers.CharField()
    expires_at = serializers.DateTimeField()


class ApiTokenSerializer(serializers.ModelSerializer):
    current = serializers.SerializerMethodField(help_text="the token this request was signed in with")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "hint", "created_at", "expires_at", "last_used_at", "expired", "current"]

    def get_current(self, row: ApiToken) -> bool:
        auth = self.context["request"].auth
        return isinstance(auth, ApiToken) and auth.pk == row.pk


class TokenView(APIView):
    """POST username and password (and a `name` for the token, e.g. the device), get a new API token that expires
    after TFDASH_API_TOKEN_DAYS. Throttled per client address, and locked for a while after repeated wrong passwords
    from that client or for that account (the same locks as the login page)."""

    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes = [signin_limit.SignInLockoutThrottle, signin_limit.LoginRateThrottle]
    throttle_scope = "login"

    @extend_schema(
        request=SignInSerializer,
        responses={
            200: IssuedTokenSerializer,
            409: OpenApiResponse(description="the user holds as many tokens as allowed; revoke one"),
        },
    )
    def post(self, request: Request) -> Response:
        serializer = SignInSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        try:
            token, row = api_tokens.issue(serializer.validated_data["user"], serializer.validated_data.get("name", ""))
        except api_tokens.TooMany as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response({"token": token, "id": row.pk, "name": row.name, "expires_at": row.expires_at})

    def throttled(self, request: Request, wait: float | None) -> None:
        # DRF adds "Expected available in N seconds."; Retry-After carries the same number.
        raise exceptions.Throttled(wait=wait, detail="Too many sign-in attempts from your address.")


class ApiTokenViewSet(mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your own API tokens (never the tokens themselves, only a few first characters): list, revoke."""

    serializer_class = ApiTokenSerializer
    pagination_class = None
    lookup_value_regex = r"[0-9]+"

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(
        request=None,
        responses={204: None, 400: OpenApiResponse(description="the request was not signed in with a token")},
    )
    @action(detail=False, methods=["delete"])
    def current(self, request: Request) -> Response:
        """Revoke the token this request was signed in with (`tfdash logout`)."""
        if not isinstance(request.auth, ApiToken):
            return Response(
                {"detail": "This request was not signed in with an API token; there is none to revoke."},
                status=status.HTTP_400_BAD_REQUEST,
            )
        request.auth.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
