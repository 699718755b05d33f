"""Plain HTTP to the cluster's object store, with the presigned URLs of a launch order (contracts/store.py).

This host holds no credential of the store, and its URLs reach its own job's keys only: GET into a file with a
bound, PUT from bytes or a file, hashed while sent, and a task attempt's artifact slots (its keys, each used once).
URLs are logged without their query (contracts.store.shown): never the signature or the credential.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import threading
from typing import IO
from urllib.parse import urlsplit

from contracts.store import shown

HTTP_TIMEOUT_S = 60.0
CHUNK = 1 << 20


class StoreError(Exception):
    pass


# --- HTTP ---------------------------------------------------------------------------------------------------------
def _connection(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    return kind(parts.netloc, timeout=HTTP_TIMEOUT_S), target


def http_get(url: str, out: IO[bytes], max_bytes: int) -> tuple[int, int, str]:
    """(status, bytes, sha256) of a GET written to `out` (on 2xx only); StoreError past `max_bytes`."""
    conn, target = _connection(url)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        if response.status // 100 != 2:
            response.read(64 * 1024)
            return response.status, 0, ""
        digest, size = hashlib.sha256(), 0
        while chunk := response.read(CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise StoreError(f"GET {shown(url)}: more than {max_bytes} bytes")
            digest.update(chunk)
            out.write(chunk)
        return response.status, size, digest.hexdigest()
    except OSError as exc:
        raise StoreError(f"GET {shown(url)}: {exc}") from None
    finally:
        conn.close()


class _Hashing:
    """A file read for a PUT body, hashed as it is read."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = CHUNK) -> bytes:
        chunk = self.handle.read(size if size and size > 0 else CHUNK)
        self.digest.update(chunk)
        self.size += len(chunk)
        return chunk


def http_put(url: str, body: IO[bytes] | bytes, size: int) -> str:
    """PUT `size` bytes; their SHA-256. StoreError when the store refuses."""
    conn, target = _connection(url)
    hashing = _Hashing(body) if not isinstance(body, bytes) else None
    try:
        conn.putrequest("PUT", target, skip_accept_encoding=True)
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        if hashing is None:
            assert isinstance(body, bytes)
            conn.send(body)
            digest = hashlib.sha256(body).hexdigest()
        else:
            while hashing.size < size and (chunk := hashing.read(min(CHUNK, size - hashing.size))):
                conn.send(chunk)
            if hashing.size != size:
                raise StoreError(f"PUT {shown(url)}: the file ended at {hashing.size} of {size} bytes")
            digest = hashing.digest.hexdigest()
        response = conn.getresponse()
        text = response.read(4096)
        if response.status // 100 != 2:
            raise StoreError(f"PUT {shown(url)}: {response.status} {_error_code(text)}")
        return digest
    except OSError as exc:
        raise StoreError(f"PUT {shown(url)}: {exc}") from None
    finally:
        conn.close()


def _error_code(text: bytes) -> str:
    found = re.search(rb"<Code>([A-Za-z]{1,64})</Code>", text)
    return found.group(1).decode() if found else ""


# --- artifacts ------------------------------------------------------------------------------------------------------
class ArtifactSlots:
    """A task attempt's artifact keys: each used once, in order."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = list(urls)
        self._next = 0
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._urls)

    def take(self) -> tuple[int, str] | None:
        with self._lock:
            if self._next >= len(self._urls):
                return None
            slot = self._next
            self._next += 1
            return slot, self._urls[slot]
