"""Appends a line to the file named in argv[1] (how often it ran) and exits 0."""

import sys

with open(sys.argv[1], "a") as marker:
    marker.write("ran\n")
