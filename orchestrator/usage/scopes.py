"""Whose usage a person may read, the one rule (DESIGN.md's trust table: a user's own usage; issue 46: and their
groups'): staff read everyone's; a user reads their own, and the usage of every group they belong to, which is its
members' (so a group-mate's own usage too). Anyone else's is refused, not filtered out in silence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group


class NotYours(PermissionError):
    """A user or group the reader may not see (or that does not exist: a user learns nothing from the difference)."""


@dataclass(frozen=True)
class Scope:
    """What a reader may see: None for everyone (staff)."""

    users: frozenset[int] | None
    groups: frozenset[int] | None

    @property
    def everyone(self) -> bool:
        return self.users is None


EVERYONE = Scope(users=None, groups=None)


def scope_of(user: Any) -> Scope:
    if user.is_staff:
        return EVERYONE
    groups = frozenset(Group.objects.filter(user=user.pk).values_list("pk", flat=True))
    mates = get_user_model().objects.filter(groups__in=groups).values_list("pk", flat=True) if groups else []
    return Scope(users=frozenset({user.pk, *mates}), groups=groups)


def user_named(scope: Scope, name: str) -> int:
    """The id of the user called `name`, who must be in the scope."""
    pk = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: name}).values_list("pk", flat=True).first()
    if pk is None and scope.everyone:
        raise LookupError(f"No user named {name[:150]!r}.")
    if pk is None or (scope.users is not None and pk not in scope.users):
        raise NotYours("You may read your own usage and your groups' only.")
    return int(pk)


def group_named(scope: Scope, name: str) -> int:
    """The id of the group called `name`, which must be one of the reader's (staff: any)."""
    pk = Group.objects.filter(name=name).values_list("pk", flat=True).first()
    if pk is None and scope.everyone:
        raise LookupError(f"No group named {name[:150]!r}.")
    if pk is None or (scope.groups is not None and pk not in scope.groups):
        raise NotYours("You may read the usage of your own groups only.")
    return int(pk)
