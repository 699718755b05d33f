"""Who may submit at a priority class: the one rule every path that gives a job a class reads (the form, the API, the
CLI through the API, experiments and "run again" through submission.validate), and the words that say it.

A class is open to a user when it is the default (a job naming no class must always be possible), or staff opened it
to all, or named the user or one of the user's groups; staff may use every class, since they may move any waiting job
to any class anyway (control/queue_view.py, recorded in the job's history). Like Slurm's QOS per account and
Kubernetes' PriorityClass with a quota scoped by class: a class above the others is a right staff grant, not a wish.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from orchestrator.models import PriorityClass


def may_use(cls: PriorityClass, user: Any) -> bool:
    if cls.is_default or cls.open_to_all or getattr(user, "is_staff", False):
        return True
    if user is None or user.pk is None:
        return False
    return cls.users.filter(pk=user.pk).exists() or cls.groups.filter(user=user.pk).exists()


def usable_names(user: Any) -> list[str]:
    """The classes `user` may submit at, highest first."""
    return [cls.name for cls in PriorityClass.objects.all() if may_use(cls, user)]


def refusal(cls: PriorityClass, user: Any) -> str | None:
    """Why `user` may not submit at `cls` (the priority field's message), or None when they may."""
    if may_use(cls, user):
        return None
    mine = ", ".join(usable_names(user)) or "none"
    return (
        f"Priority class {cls.name!r} is not open to you: staff grant it to users and groups "
        f"(it is for {who_may_use(cls)}). Classes you may use: {mine}."
    )


def who_may_use(cls: PriorityClass) -> str:
    """The class's rule in words, as the queue page, the API and a refusal say it."""
    if cls.is_default:
        return "everyone (the default class)"
    if cls.open_to_all:
        return "everyone"
    names = [f"user {name}" for name in _names(cls.users.all(), "username")]
    names += [f"group {name}" for name in _names(cls.groups.all(), "name")]
    return ", ".join([*names, "staff"])


def rules(user: Any) -> list[dict[str, Any]]:
    """Every class with its rule, highest first, and whether `user` may use it (the queue page and API)."""
    classes = PriorityClass.objects.prefetch_related("users", "groups")
    return [
        {
            "name": cls.name,
            "value": cls.value,
            "preemptible": cls.preemptible,
            "is_default": cls.is_default,
            "description": cls.description,
            "min_run_s": cls.min_run_s,
            "max_preemptions": cls.max_preemptions,
            "preemption_window_s": cls.preemption_window_s,
            "open_to_all": cls.is_default or cls.open_to_all,
            "users": _names(cls.users.all(), "username"),
            "groups": _names(cls.groups.all(), "name"),
            "who": who_may_use(cls),
            "you_may_use": may_use(cls, user),
        }
        for cls in classes
    ]


def _names(rows: Iterable[Any], attribute: str) -> list[str]:
    return sorted(str(getattr(row, attribute)) for row in rows)
