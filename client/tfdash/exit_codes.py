"""The `tfdash` command's exit codes, which a shell script can test (docs/cli.md), and which outcome or error gives
which."""

from __future__ import annotations

from tfdash.errors import AuthError, NotFound, Refused, TfdashError, Unreachable, Unsupported

# Exit codes a shell script can test (docs/cli.md).
OK = 0
JOB_FAILED = 1  # --wait: the job ended failed
USAGE = 2  # a bad command line or input, refused before anything was sent (argparse's own code)
AUTH = 3  # not logged in, or the token or password was refused
NOT_FOUND = 4  # no such job, task, experiment, cluster or artifact (or another user's)
REFUSED = 5  # the server refused the request: the job cannot run as given, or it already ended (cancel)
UNREACHABLE = 6  # no answer from the server, or a server error
UNSUPPORTED = 7  # the server does not offer this command's API
JOB_CANCELLED = 8  # --wait: the job was cancelled
JOB_TIMED_OUT = 9  # --wait: the job reached its time limit
INTERRUPTED = 130  # Ctrl-C (a job being waited for goes on running)

EXIT_CODES = f"""exit codes:
  {OK}    done; with --wait: the job succeeded
  {JOB_FAILED}    --wait: the job failed
  {USAGE}    bad command line or input (nothing was sent)
  {AUTH}    not logged in, or the token or password was refused
  {NOT_FOUND}    no such job, task, experiment, cluster or artifact (or not yours)
  {REFUSED}    the server refused the request (the job cannot run as given; cancel: it already ended)
  {UNREACHABLE}    the server did not answer, or failed
  {UNSUPPORTED}    the server does not offer this command's API
  {JOB_CANCELLED}    --wait: the job was cancelled
  {JOB_TIMED_OUT}    --wait: the job reached its time limit (timed out)
  {INTERRUPTED}  interrupted (Ctrl-C); a job being waited for goes on running"""

OUTCOMES = {"succeeded": OK, "failed": JOB_FAILED, "cancelled": JOB_CANCELLED, "timed_out": JOB_TIMED_OUT}
ERRORS: dict[type[TfdashError], int] = {
    AuthError: AUTH,
    NotFound: NOT_FOUND,
    Refused: REFUSED,
    Unreachable: UNREACHABLE,
    Unsupported: UNSUPPORTED,
}
