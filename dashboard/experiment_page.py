"""The experiment page's table: the summary's numbers (orchestrator/experiments/summary.py, what the API
returns too) as text, one row per variant, the best value of each column marked where the variants differ."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dashboard.compare import Cell, format_seconds
from orchestrator.core.verdict import is_best


@dataclass(frozen=True)
class Column:
    key: str  # the summary's key, and the cell's data-key (tests read both)
    label: str
    fmt: Callable[[float], str]
    lower_is_better: bool | None  # None: no "best"


COLUMNS: tuple[Column, ...] = (
    Column("mean_epoch_s", "Wall time per epoch", format_seconds, True),
    Column("examples_per_s", "Examples/s", lambda v: f"{v:,.0f}", False),
    Column("scaling_efficiency", "Scaling efficiency", lambda v: f"{v:.0%}", False),
    Column("final_loss", "Final loss", lambda v: f"{v:.4f}", True),
    Column("final_accuracy", "Final accuracy", lambda v: f"{v:.4f}", False),
    Column("time_to_target_s", "Time to target", format_seconds, True),
)


def experiment_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    variants = summary["variants"]
    rows = []
    for variant in variants:
        cells = []
        for column in COLUMNS:
            value = variant[column.key]
            if value is None:
                text = _missing(column.key, variant)
                cells.append((column, Cell(text)))
                continue
            best = column.lower_is_better is not None and is_best(
                [v[column.key] for v in variants], value, lower_is_better=column.lower_is_better
            )
            text = column.fmt(value)
            if column.key == "time_to_target_s":
                text += f" (epoch {variant['epochs_to_target']})"
            cells.append((column, Cell(text, best=best)))
        rows.append({"variant": variant, "cells": cells})
    return rows


def _missing(key: str, variant: dict[str, Any]) -> str:
    if key == "time_to_target_s" and variant["state"] == "succeeded":
        return "not reached"
    if key == "scaling_efficiency" and variant["baseline"]:
        return "baseline"
    return "—"
