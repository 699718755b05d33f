"""OpenAPI post-processing: declare the error answers every operation can give, with their bodies.

drf-spectacular documents only the success of each operation; clients (and Schemathesis) must also know that a bad
body gets 400 with field -> messages, an unknown or foreign id 404, and so on.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "required": ["detail"],
}
# `{"field": ["message", ...]}`, `{"non_field_errors": [...]}`, `{"variants": [{"field": [...]}, {}]}` for a list of
# objects, or `{"detail": "..."}` for a body that is not JSON.
VALIDATION_ERROR_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            {"type": "string"},
            # A list field's errors (experiment variants) are one entry per item: an object of field errors (`{}` for
            # an item without any), or a list of messages for an item that is no object at all.
            {
                "type": "array",
                "items": {
                    "anyOf": [{"type": "string"}, {"type": "object"}, {"type": "array", "items": {"type": "string"}}]
                },
            },
            {"type": "object"},
        ]
    },
}

_ERRORS = {
    "400": ("The request was refused: each field names what is wrong with it.", "ValidationErrors"),
    "401": ("No valid token or session.", "ErrorDetail"),
    "403": ("Signed in, but not allowed (only staff change clusters and hosts).", "ErrorDetail"),
    "404": ("No such object, or it belongs to another user.", "ErrorDetail"),
    "429": ("Too many attempts; the Retry-After header says when to try again.", "ErrorDetail"),
}


def _response(code: str) -> dict[str, Any]:
    description, name = _ERRORS[code]
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def declare_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """A drf-spectacular POSTPROCESSING_HOOK."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorDetail", ERROR_SCHEMA)
    schemas.setdefault("ValidationErrors", VALIDATION_ERROR_SCHEMA)
    for path, operations in result.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            codes = []
            if operation.get("security") != [{}] and path != "/api/token/":
                codes += ["401", "403"]
            if "{" in path:
                codes.append("404")
            if "requestBody" in operation or any(p.get("in") == "query" for p in operation.get("parameters", [])):
                codes.append("400")
            if path == "/api/token/":
                codes += ["400", "429"]
            for code in codes:
                operation["responses"].setdefault(code, _response(code))
    return result
