"""A name an installed package no longer has (moved to collections.abc in Python 3.3, removed from collections in 3.10):
an import that fails on this host's Python."""

from __future__ import annotations

from collections import Mapping  # type: ignore[attr-defined]  # noqa: UP035

print(Mapping)
