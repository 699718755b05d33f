"""Writes to both streams (a giant line, a last line without newline) and exits with the code in argv[1]."""

import sys

print("out-1")
print("err-1", file=sys.stderr)
print("out-2")
print("x" * 50_000)
print("caf\xe9 \u2713")
sys.stdout.write("no newline at the end")
sys.stdout.flush()
sys.exit(int(sys.argv[1]))
