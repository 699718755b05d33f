"""Prints argv[1] numbered lines as fast as it can."""

import sys

for i in range(int(sys.argv[1])):
    print(f"line {i}")
