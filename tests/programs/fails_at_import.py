"""A training script that fails at its first import: a module this host does not have (a preflight's case)."""

import tfdash_preflight_no_such_module  # noqa: F401

print("never reached", flush=True)
