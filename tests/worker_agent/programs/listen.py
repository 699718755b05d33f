"""Listens on the port in argv[1] (from a child process with --in-child), then waits to be killed."""

import socket
import subprocess
import sys
import time

port = int(sys.argv[1])
if "--in-child" in sys.argv:
    subprocess.Popen([sys.executable, __file__, str(port)])
    time.sleep(3600)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TF's gRPC server does
server.bind(("0.0.0.0", port))
server.listen()
print("listening", flush=True)
time.sleep(3600)
