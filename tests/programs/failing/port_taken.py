"""The script starts its own server on a fixed port (a metrics page on 6006, say) that another process holds already:
the bind fails with "Address already in use". The holder is this script's first socket, so the run needs no other
process."""

from __future__ import annotations

import http.server
import socket

if __name__ == "__main__":
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    print(f"serving metrics on port {port}", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
