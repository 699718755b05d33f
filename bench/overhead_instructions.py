"""What the product's injected parts cost a fit, counted in instructions: bench/overhead.py's ABBA fits (the same
model and data: bench/fit_fixture.py) run under valgrind's callgrind, each fit's instructions dumped on its own.

Why: on this shared VM a fit's CPU time varies by about 4 % between identical fits, so overhead.py's median over
30 rounds lands anywhere in 0.97-1.00 around a cost of well under 1 %. An instruction count does not depend on what
else the machine runs: identical fits count within about 0.1 % of each other (the control below says how close), so
one or two rounds give the ratio to the third decimal. Instructions are not seconds (a cache miss costs more than an
add), so this is the CPU work the product adds to training, beside overhead.py's CPU time and wall clock.

Every thread's instructions count (callgrind sums them): TensorFlow's, the drain thread's, the callback's. Under
valgrind the fits run 40-250 times slower (90 on a quiet machine here), and the product's clocks would see that: the
input-wait sampling would sample that many times more steps (one per 50 ms of training) and the callback would close
that many times more windows (one per 0.5 s). So the bench first times the same fit natively, then stretches both
intervals by the slowdown it measures under valgrind: the product does per step what it does at native speed
(`--no-stretch` counts the unstretched, an upper bound).

    .venv/bin/python bench/overhead_instructions.py [--rounds 2] [--examples 16384] [--keras tf_keras|keras3]

Needs valgrind and gcc (both on this machine kind: Debian's valgrind package carries callgrind.h). TensorFlow's
import alone takes 3 minutes under valgrind: `--rounds 1 --examples 1024` took 4 minutes on a quiet machine here, the
defaults 49 beside the test suite and stress-ng. Exit 0: goal met (ratio >= 0.98). Figures: docs/sizing.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fit_fixture import Fit, add_fit_arguments, build, steps_per_fit

GOAL = 0.98
# Two client requests of callgrind.h: dump the counters since the last dump under a label (and zero them), and
# whether this process runs under valgrind (0 natively).
_CLIENT = """
#include <valgrind/callgrind.h>
void tfdash_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int tfdash_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each four fits)")
    parser.add_argument("--no-stretch", action="store_true", help="keep the product's intervals as they are")
    parser.add_argument("--inner", help=argparse.SUPPRESS)  # the run under valgrind: its JSON arguments
    parser.add_argument("--native", action="store_true", help=argparse.SUPPRESS)  # the native step time's run
    add_fit_arguments(parser, epochs=1, examples=16384)
    args = parser.parse_args()
    if args.inner:
        return inner(args)
    if args.native:
        return native(args)
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: this bench counts instructions with valgrind's callgrind")
    with tempfile.TemporaryDirectory(prefix="tfdash-callgrind-") as folder:
        work = Path(folder)
        library = build_client(work)
        native_step_s = native_step_time(args)
        print(f"native: {native_step_s * 1e6:,.0f} us a step (wall, median of 3 fits without the product)", flush=True)
        inner_args = {"library": str(library), "native_step_s": native_step_s}
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/fits", "--dump-line=no",
            sys.executable, __file__, "--inner", json.dumps(inner_args), *forwarded(args),
        ]  # fmt: skip
        started = time.monotonic()
        run = subprocess.run(command, stderr=subprocess.PIPE, text=True, check=False)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"the run under valgrind failed (exit {run.returncode})")
        print(f"under valgrind: {time.monotonic() - started:,.0f} s", flush=True)
        counts = read_dumps(work)
    return report(args, counts)


def build_client(work: Path) -> Path:
    """The client requests as a shared library in `work`, for ctypes."""
    (work / "client.c").write_text(_CLIENT)
    library = work / "client.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(work / "client.c")], check=True)
    return library


def forwarded(args: argparse.Namespace) -> list[str]:
    """The fit's own options, for the run under valgrind."""
    names = ("rounds", "epochs", "batch", "examples", "keras", "width", "layers", "parts", "op_threads")
    out = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]
    return [*out, "--no-stretch"] if args.no_stretch else out


def native_step_time(args: argparse.Namespace) -> float:
    """A step's wall time without the product, natively: this bench with `--native`, in a process of its own."""
    fit_options = [option for option in forwarded(args) if not option.startswith(("--rounds", "--no-stretch"))]
    out = subprocess.run([sys.executable, __file__, "--native", *fit_options], capture_output=True, text=True,
                         check=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def bare_step_times(fit: Fit, fits: int) -> list[float]:
    """The wall time of a step, in each of `fits` fits without the product."""
    times = []
    for _ in range(fits):
        started = time.perf_counter()
        fit.run(False)
        times.append((time.perf_counter() - started) / fit.steps)
    return times


def native(args: argparse.Namespace) -> int:
    """Prints the median wall time of a step over three fits without the product."""
    print(statistics.median(bare_step_times(build(args), 3)))
    return 0


def inner(args: argparse.Namespace) -> int:
    """Under valgrind: the same ABBA fits as overhead.py, each fit's instructions dumped under its label."""
    given = json.loads(args.inner)
    client = ctypes.CDLL(given["library"])
    if not client.tfdash_on_valgrind():
        raise SystemExit("--inner runs under valgrind only")
    fit = build(args)
    from worker_agent.runtime.metrics import MIN_INTERVAL_S

    slowdown = min(bare_step_times(fit, 2)) / given["native_step_s"]
    stretch = 1.0 if args.no_stretch else slowdown
    # The product's two clocks, stretched as the fits are: the sampling's gap (SampledTrainFunction keeps it per
    # instance) and the callback's window.
    fit.product._gap_s *= stretch
    fit.min_interval_s = MIN_INTERVAL_S * stretch
    print(f"under valgrind: {slowdown:.0f} x slower than natively; the product's intervals x {stretch:.0f}", flush=True)
    client.tfdash_dump(b"setup")
    for round_ in range(args.rounds):
        order = (False, True, True, False) if round_ % 2 == 0 else (True, False, False, True)
        for position, with_product in enumerate(order):
            fit.run(with_product)
            client.tfdash_dump(f"{'with' if with_product else 'without'} {round_} {position}".encode())
    print(f"{fit.drained['lines']} metric lines written, {fit.drained['input_wait']} with input_wait_fraction")
    return 0


def read_dumps(work: Path) -> list[tuple[str, int]]:
    """(label, instructions) of each dump but the setup's, in the order dumped."""
    counts = []
    for path in sorted(work.glob("fits.*"), key=lambda p: int(p.name.rsplit(".", 1)[-1])):
        text = path.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.MULTILINE)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        if label and total and label.group(1) != "setup":
            counts.append((label.group(1), int(total.group(1))))
    return counts


def report(args: argparse.Namespace, counts: list[tuple[str, int]]) -> int:
    fits: dict[tuple[str, int], list[int]] = {}  # (with|without, round) -> its two fits' instructions
    for label, n in counts:
        kind, round_, _position = label.split()
        fits.setdefault((kind, int(round_)), []).append(n)
    if sorted(len(each) for each in fits.values()) != [2] * (2 * args.rounds):
        raise SystemExit(f"expected two fits of each kind in each of {args.rounds} rounds, read {counts}")
    steps = steps_per_fit(args)
    ratios, controls = [], []
    for round_ in range(args.rounds):
        bare, ours = fits["without", round_], fits["with", round_]
        ratios.append(sum(bare) / sum(ours))
        controls.append(bare[0] / bare[1])
        print(
            f"round {round_ + 1}: instructions without {bare[0]:,} {bare[1]:,}  with {ours[0]:,} {ours[1]:,}  "
            f"ratio {ratios[-1]:.4f}  control {controls[-1]:.4f}"
        )
    bare_step = statistics.mean(n for (kind, _), each in fits.items() if kind == "without" for n in each) / steps
    ours_step = statistics.mean(n for (kind, _), each in fits.items() if kind == "with" for n in each) / steps
    ratio = statistics.mean(ratios)
    print(
        f"keras={args.keras} parts={args.parts} {steps} steps a fit: {bare_step:,.0f} instructions a step without, "
        f"{ours_step:,.0f} with (+{ours_step - bare_step:,.0f})"
    )
    print(f"control (without / without): {min(controls):.4f}-{max(controls):.4f}  <- the count's own noise")
    print(f"ratio without/with, instructions: {ratio:.4f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
