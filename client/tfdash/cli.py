"""The `tfdash` command: submit, watch and fetch tf.distribute jobs from a terminal, over the REST API
(tfdash.client). `tfdash --help` lists the commands, `tfdash COMMAND --help` each one's options; the job's options
come from the server's own field definitions (tfdash/job_fields.json).

`main` is here; the commands are in cli_commands.py, their parsers in cli_parsers.py, argument types in cli_args.py,
what they print in cli_output.py and the exit codes in exit_codes.py."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.markup import escape

from tfdash import __version__
from tfdash.cli_args import Usage
from tfdash.cli_output import err
from tfdash.cli_parsers import build_parsers
from tfdash.client import Client
from tfdash.errors import TfdashError
from tfdash.exit_codes import ERRORS, EXIT_CODES, INTERRUPTED, OK, UNREACHABLE, USAGE


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parsers = build_parsers()
    top = argparse.ArgumentParser(
        prog="tfdash",
        description="Submit, watch and fetch tf.distribute jobs on a tfdash server.",
        epilog="commands: " + ", ".join(parsers) + "\n(tfdash COMMAND --help for each)\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--url", help="the server (default: the one `tfdash login` stored; env TFDASH_URL)")
    top.add_argument("--version", action="version", version=f"tfdash {__version__}")
    top.add_argument("command", choices=list(parsers), metavar="COMMAND")
    top.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = top.parse_args(args)
    parser, command, intermixed = parsers[ns.command]
    sub = parser.parse_intermixed_args(ns.rest) if intermixed else parser.parse_args(ns.rest)
    url = ns.url

    def client() -> Client:
        return Client.from_config(url)

    try:
        return command(sub, client)
    except Usage as exc:
        err.print(f"tfdash {ns.command}: error: {escape(str(exc))} (see tfdash {ns.command} --help)")
        return USAGE
    except TfdashError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return next((code for kind, code in ERRORS.items() if isinstance(exc, kind)), UNREACHABLE)
    except KeyboardInterrupt:
        err.print("interrupted")
        return INTERRUPTED
    except BrokenPipeError:  # `tfdash logs 3 | head`: the reader left; nothing more to say
        sys.stderr.close()
        return OK


if __name__ == "__main__":
    raise SystemExit(main())
