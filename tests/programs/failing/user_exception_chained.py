"""An exception raised while handling another: the verdict reports the last one (the one that ended the script)."""

from __future__ import annotations

CONFIG = {"epochs": "ten"}


def epochs() -> int:
    try:
        return int(CONFIG["epochs"])
    except ValueError as exc:
        raise RuntimeError("config 'epochs' must be a whole number") from exc


if __name__ == "__main__":
    print(f"training for {epochs()} epochs")
