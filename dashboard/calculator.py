"""The New job form's calculator: what a run of the form's shape and hyperparameters will use, computed by
contracts/batching.py (the runtime's own rules) on the server, so the page holds no second copy of a formula."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from contracts import batching
from contracts.programs import BUILTIN_PROGRAMS
from contracts.run_config import RunConfig, train_examples
from orchestrator.submit.job_fields import FIELDS, HYPERPARAMETERS, PROGRAM_FIELDS

_SPECS = {f.name: f for f in (*FIELDS, *HYPERPARAMETERS, *PROGRAM_FIELDS)}


@dataclass(frozen=True)
class CalcView:
    calculation: batching.Calculation | None
    problem: str
    base_learning_rate: float
    warmup_epochs: float
    epochs: int
    program: str
    train_examples: int | None

    @property
    def effective_text(self) -> str:
        return "" if self.calculation is None else plain(self.calculation.effective_learning_rate)

    @property
    def base_text(self) -> str:
        return plain(self.base_learning_rate)

    @property
    def warmup_text(self) -> str:
        return plain(self.warmup_epochs)


def plain(value: float) -> str:
    """A rate as people write it: 0.02, not 0.020000000000000004."""
    return f"{value:.6g}"


def _number(params: Mapping[str, str], name: str, kind: type[int] | type[float]) -> float:
    """A field's value, its default when left empty; ValueError names the field by its label."""
    raw = (params.get(name) or "").strip()
    if not raw:
        return kind(_SPECS[name].default)
    try:
        value = kind(raw)
        if not math.isfinite(value):
            raise ValueError(raw)
        return value
    except ValueError:
        raise ValueError(f"{_SPECS[name].label} must be a {'whole ' if kind is int else ''}number") from None


def calculate(params: Mapping[str, str]) -> CalcView:
    """From the form's raw values (the page sends them as they are typed)."""
    program = params.get("program") or ""
    base, warmup, epochs = 0.0, 0.0, 0
    try:
        base = _number(params, "learning_rate", float)
        warmup = _number(params, "warmup_epochs", float)
        epochs = int(_number(params, "epochs", int))
        examples = None
        if program in BUILTIN_PROGRAMS:
            examples = train_examples(RunConfig(program=program, examples=int(_number(params, "examples", int))))
        scale = params.get("scale_lr") or str(_SPECS["scale_lr"].default)
        calculation = batching.calculate(
            params.get("strategy") or "",
            int(_number(params, "workers", int)),
            int(_number(params, "devices_per_worker", int)),
            int(_number(params, "per_replica_batch", int)),
            base,
            scale,
            warmup,
            examples,
        )
    except ValueError as exc:
        return CalcView(None, str(exc), base, warmup, epochs, program, None)
    return CalcView(calculation, "", base, warmup, epochs, program, examples)
