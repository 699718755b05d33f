"""Out of host memory, for real but bounded: the address space is limited to 1 GiB (as a container's limit would do),
then the script loads a dataset bigger than that; Python raises MemoryError."""

from __future__ import annotations

import resource

LIMIT = 1 << 30
resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def load_dataset() -> bytearray:
    return bytearray(2 * LIMIT)  # the whole dataset in memory at once


if __name__ == "__main__":
    print("loading the dataset", flush=True)
    data = load_dataset()
    print(len(data))
