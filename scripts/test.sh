#!/usr/bin/env bash
# rollcall's test command: installs what is missing, starts real backends
# (redis-server, etcd, moto_server) on free loopback ports and a confined Docker
# engine (scripts/docker.sh), runs every test of the workspace with all features
# against them, and stops the servers.
#
#   scripts/test.sh [extra nextest/cargo test args]
#
# A missing backend fails its tests (ROLLCALL_SKIP_MISSING_BACKENDS=1 skips them
# instead, except when CI is set).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/backends.sh
source scripts/backends.sh
# shellcheck source=scripts/docker.sh
source scripts/docker.sh

backends_install
# A Docker engine and the fixtures' images: the fault tests that need
# containers (`docker pause`) run in this pass.
docker_up
trap backends_stop EXIT
backends_start

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast "$@"
  # nextest does not run doctests.
  cargo test --workspace --all-features --doc
else
  cargo test --workspace --all-features --no-fail-fast "$@"
fi
