"""A user's job that keeps something private in its job folder: a secret and a "checkpoint" another job could poison."""

import os
from pathlib import Path

folder = Path(os.environ["TFDASH_JOB_DIR"])
(folder / "secret.txt").write_text("the victim's secret\n")
(folder / "checkpoints").mkdir(exist_ok=True)
(folder / "checkpoints" / "ckpt-1").write_text("the victim's weights\n")
print(f"left a secret in {folder} as uid {os.getuid()}", flush=True)
