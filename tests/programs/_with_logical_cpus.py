"""Test-only launcher: split the CPU into N logical devices, then run a script as ``__main__``.

Usage: python _with_logical_cpus.py N script.py [script args...]

Stands in for what the product does before a user script runs on a CPU host, so the programs here can be run bare.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: _with_logical_cpus.py N script.py [args...]")
    count = int(sys.argv[1])
    script = sys.argv[2]

    import tensorflow as tf

    # Must happen before anything initializes the devices.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)

    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
