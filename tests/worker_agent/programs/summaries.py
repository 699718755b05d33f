"""Writes TensorBoard-like files under TFDASH_TENSORBOARD_DIR, and a symlink to the file named by argv[1]."""

import os
import sys
from pathlib import Path

root = Path(os.environ["TFDASH_TENSORBOARD_DIR"])
(root / "train").mkdir(parents=True, exist_ok=True)
(root / "train" / "events.out.tfevents.1.host.1.v2").write_bytes(b"train-events")
(root / "validation" / "deep").mkdir(parents=True, exist_ok=True)
(root / "validation" / "deep" / "events.out.tfevents.2.host.1.v2").write_bytes(b"validation-events")
if len(sys.argv) > 1:
    os.symlink(sys.argv[1], root / "stolen")
    os.symlink(Path(sys.argv[1]).parent, root / "stolen-folder")
print(root)
