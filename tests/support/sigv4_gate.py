"""A SigV4 gate in front of a moto server, for the object-store tests: moto does not check the signature of a
presigned (query-string signed) URL at all (and with its IAM checks on, it fails such a request with a KeyError on
the Authorization header), so on its own it cannot show that a URL signed for one key is refused on another.

This process accepts a request carrying a query-string signature only when botocore, given the credentials, computes
the same signature for that method, path, query and host, and the URL has not expired; it forwards it to moto
then. A request signed in its Authorization header (the control plane's boto3 client) is forwarded as it is; any
other is refused as anonymous. Run as `python -m tests.support.sigv4_gate PORT UPSTREAM KEY_ID SECRET_FILE`.
"""

from __future__ import annotations

import calendar
import hmac
import http.client
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def _error(code: str, status: int) -> tuple[int, bytes]:
    return status, f"<?xml version='1.0'?><Error><Code>{code}</Code></Error>".encode()


class Gate(BaseHTTPRequestHandler):
    upstream = ""
    credentials: Credentials | None = None
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        refused = self._refusal() if len(body) == length else _error("IncompleteBody", 400)
        if refused is not None:
            self._reply(*refused)
            return
        parts = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(parts.netloc, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                    self.send_header(key, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    def _refusal(self) -> tuple[int, bytes] | None:
        query = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        if "X-Amz-Signature" not in query:
            return None if "Authorization" in self.headers else _error("AccessDenied", 403)
        assert self.credentials is not None
        try:
            signed_at = calendar.timegm(time.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
            expires = int(query["X-Amz-Expires"])
            region = query["X-Amz-Credential"].split("/")[2]
        except (KeyError, ValueError, IndexError):
            return _error("AuthorizationQueryParametersError", 400)
        if time.time() > signed_at + expires:
            return _error("AccessDenied", 403)  # S3: "Request has expired"
        given = query.pop("X-Amz-Signature")
        path = urlsplit(self.path).path
        # The signer adds its own X-Amz-* parameters back (from the time and credentials given it).
        rest = {k: v for k, v in query.items() if not k.startswith("X-Amz-")}
        url = f"http://{self.headers['Host']}{path}" + (f"?{urlencode(rest)}" if rest else "")
        request = AWSRequest(method=self.command, url=url, headers={"host": self.headers["Host"]})
        request.context["timestamp"] = query["X-Amz-Date"]
        # add_auth would stamp the present time; these are its steps with the URL's own time (as moto's IAM does).
        auth = S3SigV4QueryAuth(self.credentials, "s3", region, expires=expires)
        auth._modify_request_before_signing(request)
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        if not hmac.compare_digest(given, expected):
            return _error("SignatureDoesNotMatch", 403)
        return None

    def _reply(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle


def main() -> None:
    port, upstream, key_id, secret_file = sys.argv[1:5]
    address = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.1"  # a bridge's, for hosts of their own (netns.py)
    with open(secret_file) as handle:
        secret = handle.read().strip()
    Gate.upstream = upstream
    Gate.credentials = Credentials(key_id, secret)
    ThreadingHTTPServer((address, int(port)), Gate).serve_forever()


if __name__ == "__main__":
    main()
