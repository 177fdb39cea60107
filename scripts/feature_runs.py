#!/usr/bin/env python3
"""The feature sets CI checks each published crate with, one per line:
`<crate> default`, `<crate> -` (no features, for a crate with defaults) and
`<crate> <feature>` for each feature alone, except one that equals the
default set. Read from `cargo metadata` on standard input; `.ci/run`'s feature
loop and `scripts/check-msrv.py` both use `runs`."""

import json
import sys


def runs(meta):
    """(crate, feature) pairs: feature is "default", "" (none) or a feature."""
    members = set(meta["workspace_members"])
    out = []
    for p in meta["packages"]:
        if p["id"] not in members or p.get("publish") == []:
            continue
        default = sorted(p["features"].get("default", []))
        out.append((p["name"], "default"))
        if "default" in p["features"]:
            out.append((p["name"], ""))
        # A feature alone that is the default set is the default run again.
        out += [(p["name"], f) for f in sorted(p["features"]) if f != "default" and [f] != default]
    return out


if __name__ == "__main__":
    for crate, feature in runs(json.load(sys.stdin)):
        print(crate, feature or "-")
