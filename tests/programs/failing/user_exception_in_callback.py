"""A user's function called back by a library (json's object hook): the verdict names the user's frame, not the
library's frames below or above it."""

from __future__ import annotations

import json

RECORDS = '[{"image": [0, 1], "label": 3}, {"image": [1, 1]}]'


def to_example(record: dict) -> tuple:
    return record["image"], record["label"]


if __name__ == "__main__":
    examples = json.loads(RECORDS, object_hook=to_example)
    print(len(examples))
