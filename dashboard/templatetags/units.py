from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def filesizeformat_mb(mebibytes: int | None) -> str:
    if not mebibytes:
        return "—"
    if mebibytes >= 1024:
        return f"{mebibytes / 1024:.1f} GiB"
    return f"{mebibytes} MiB"
