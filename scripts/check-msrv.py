#!/usr/bin/env python3
"""Checks each published crate's `rust-version` against its dependencies.

For every published crate, with its default features and (for a crate with
features) each feature alone, the dependency tree as `Cargo.lock` pins it on
Linux (normal and build dependencies: what a user compiles) is listed with
`cargo tree`; the highest `rust-version` a dependency declares must not be above
the highest declared by the crate itself or by a workspace crate in that tree
(the facade with the `dynamodb` feature needs what the DynamoDB provider
declares). A dependency update that raises the minimum Rust fails here, before
a user on the stated version finds it.

The machine has one toolchain, so this is not a build with the stated version:
it trusts the dependencies' own declarations, and clippy's `incompatible_msrv`
lint checks this workspace's code against the same field.
"""

import json
import subprocess
import sys

import feature_runs  # beside this script

TARGET = "x86_64-unknown-linux-gnu"


def version(v):
    """`1.85` as (1, 85, 0): a rust-version may leave out the patch."""
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return ".".join(map(str, v[:2] if v[2] == 0 else v))


def main():
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    declared = {}
    for p in meta["packages"]:
        declared[f'{p["name"]} v{p["version"]}'] = p.get("rust_version")
    failures = []
    for name, feature in feature_runs.runs(meta):
        if feature == "":
            continue  # no features: a subset of the default run's tree
        flags = [] if feature == "default" else ["--no-default-features", "--features", feature]
        tree = subprocess.run(
            ["cargo", "tree", "-p", name, *flags, "-e", "normal,build",
             "--target", TARGET, "--prefix", "none"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        ids = {line.split(" (")[0].strip() for line in tree.splitlines() if line.strip()}
        own = max(
            (version(declared[i]) for i in ids
             if declared.get(i) and i.split(" v")[0].startswith("rollcall")),
            default=(0, 0, 0),
        )
        need = max(
            ((version(declared[i]), i) for i in ids
             if declared.get(i) and not i.split(" v")[0].startswith("rollcall")),
            default=((0, 0, 0), "-"),
        )
        what = " ".join([name, *flags])
        status = "ok" if need[0] <= own else "TOO LOW"
        print(f"{what}: rust-version {show(own)}, "
              f"dependencies need {show(need[0])} ({need[1]}): {status}")
        if need[0] > own:
            failures.append(what)
    if failures:
        print("raise rust-version (Cargo.toml) for: " + ", ".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
