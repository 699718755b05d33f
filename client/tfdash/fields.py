"""The job's fields as the CLI offers them: options, bounds and defaults read from `job_fields.json`, which
scripts/gen_client_fields.py writes from the server's one definition (orchestrator/submit/job_fields.py and
contracts/). The CLI checks a value against the same bound the form and the API use, before anything is sent; the
server checks again and has the last word (a newer server's bounds win: its message comes back on the option)."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

DATA: dict[str, Any] = json.loads(resources.files("tfdash").joinpath("job_fields.json").read_text())
# The job's fields that are sent as they are (`name` is the script's stem unless --name says otherwise).
JOB_FIELDS: list[dict[str, Any]] = DATA["fields"]
HYPERPARAMETERS: list[dict[str, Any]] = DATA["hyperparameters"]
PROGRAM_FIELDS: list[dict[str, Any]] = DATA["program_fields"]
BUILTIN_PROGRAMS: dict[str, str] = DATA["builtin_programs"]
ENV_RULES: dict[str, Any] = DATA["env"]
_ENV_NAME = re.compile(rf"^{ENV_RULES['name_pattern']}$")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Option:
    """Where a parsed option goes: a job field, or a key of the run's config (`builtin_config`)."""

    dest: str
    target: str  # "field" | "config"


def add_options(parser: argparse.ArgumentParser, specs: Iterable[dict[str, Any]], target: str) -> list[Option]:
    """`--<name>` per field, typed and bounded by its spec; the default is the server's (nothing sent unless given)."""
    options = []
    for spec in specs:
        name = spec["name"]
        help_text = spec.get("help") or spec["label"]
        if spec.get("default") not in (None, ""):
            help_text += f" (default: {spec['default']})"
        if spec["kind"] == "bool":
            parser.add_argument(
                flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif spec.get("choices"):
            parser.add_argument(flag(name), dest=name, choices=spec["choices"], default=None, help=help_text)
        else:
            parser.add_argument(flag(name), dest=name, type=_parser_for(spec), default=None, help=help_text)
        options.append(Option(name, target))
    return options


def _parser_for(spec: dict[str, Any]) -> Any:
    def parse(text: str) -> Any:
        return check(spec, text)

    parse.__name__ = spec["name"]  # argparse names the type in its message
    return parse


def check(spec: dict[str, Any], text: str) -> Any:
    """`text` as the field's value, or argparse.ArgumentTypeError saying which bound it breaks."""
    name, kind = spec["name"], spec["kind"]
    if kind == "str":
        if spec.get("max_length") is not None and len(text) > spec["max_length"]:
            raise argparse.ArgumentTypeError(f"{name} is limited to {spec['max_length']} characters")
        return text
    try:
        value: float = int(text) if kind == "int" else float(text)
    except ValueError:
        noun = "a whole number" if kind == "int" else "a number"
        raise argparse.ArgumentTypeError(f"{name} must be {noun}, not {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{name} must be a finite number, not {text!r}")
    low, high = spec.get("min"), spec.get("max")
    if low is not None and (value < low or (spec.get("min_exclusive") and value == low)):
        bound = f"greater than {_number(low)}" if spec.get("min_exclusive") else f"at least {_number(low)}"
        raise argparse.ArgumentTypeError(f"{name} must be {bound}, not {text}")
    if high is not None and value > high:
        raise argparse.ArgumentTypeError(f"{name} must be at most {_number(high)}, not {text}")
    return value


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def env_problem(name: str, value: str) -> str:
    """Why NAME=value cannot be one of the job's variables (the server's rules, contracts/job_env.py), or ""."""
    if not _ENV_NAME.match(name) or len(name) > ENV_RULES["max_name_chars"]:
        return f"{name!r} is not a variable name: {ENV_RULES['name_rule']}"
    upper = name.upper()
    if upper in ENV_RULES["reserved"]:
        return f"{name} is reserved: {ENV_RULES['reserved'][upper]}"
    for prefix, why in ENV_RULES["reserved_prefixes"].items():
        if upper.startswith(prefix):
            return f"{name} is reserved: names starting with {prefix} are {why}"
    if len(value) > ENV_RULES["max_value_chars"]:
        return f"{name}'s value is limited to {ENV_RULES['max_value_chars']} characters, not {len(value)}"
    if "\x00" in value:
        return f"{name}'s value holds a NUL character"
    return ""


def parse_env(items: Iterable[str]) -> dict[str, str]:
    """`--env NAME=value` options as the job's variables; argparse.ArgumentTypeError naming the first bad one."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--env takes NAME=value, not {item!r}")
        problem = env_problem(name, value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        env[name] = value
    if len(env) > ENV_RULES["max_vars"]:
        raise argparse.ArgumentTypeError(f"a job may set at most {ENV_RULES['max_vars']} variables, not {len(env)}")
    return env


def option_for_field(field: str) -> str:
    """The option a server error's field is about: `builtin_config.epochs` -> `--epochs`, `workers` -> `--workers`."""
    prefix, _, key = field.partition(".")
    if prefix == "builtin_config" and key:
        return flag(key)
    if field in ("non_field_errors", "detail"):
        return ""
    return {"script": "SCRIPT", "builtin": "--builtin", "builtin_config": "the run's config"}.get(field, flag(field))
