from __future__ import annotations

from typing import Any

from django.contrib.auth.middleware import LoginRequiredMiddleware as DjangoLoginRequiredMiddleware
from django.http import HttpRequest, HttpResponseBase
from rest_framework.views import APIView


class LoginRequiredMiddleware(DjangoLoginRequiredMiddleware):
    """Every page needs a signed-in user, unless marked `login_not_required`.

    REST views are left to DRF, which authenticates tokens as well as sessions and answers 401/403 rather than
    redirecting a script to an HTML login form.
    """

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponseBase | None:
        view_class = getattr(view_func, "cls", None)
        if isinstance(view_class, type) and issubclass(view_class, APIView):
            return None
        return super().process_view(request, view_func, view_args, view_kwargs)
