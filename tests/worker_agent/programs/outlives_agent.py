"""Prints `--lines` numbered lines; after the first half it creates `<folder>/half` and waits for `<folder>/go`
(the test stops the agent meanwhile), prints the rest (stdout and stderr alternating), creates `<folder>/done`, and
waits to be killed."""

import argparse
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, required=True)
parser.add_argument("--folder", type=Path, required=True)
args = parser.parse_args()
half = args.lines // 2
for i in range(args.lines):
    if i == half:
        (args.folder / "half").touch()
        while not (args.folder / "go").exists():
            time.sleep(0.01)
    stream = sys.stdout if i < half or i % 2 else sys.stderr
    print(f"line {i}", file=stream, flush=True)  # a broken pipe here would end the program (BrokenPipeError)
(args.folder / "done").write_text(str(os.getpid()))
while True:
    signal.pause()
