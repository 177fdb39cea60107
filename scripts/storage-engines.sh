#!/usr/bin/env bash
# Measures what docs/ARCHITECTURE.md reports for the embedded statistics store's engine:
# the clean release build time of redb and of RocksDB (each in its own empty target
# directory, wall and CPU seconds), then the write rate of the store's key layout on
# both, in one binary, alternating engines. RocksDB needs g++ and libclang
# (Debian: libclang-dev). Not part of the test command: the RocksDB build takes minutes.
set -euo pipefail
cd "$(dirname "$0")/../bench/storage-engines"
out=${STORAGE_ENGINES_OUT:-/tmp/storage-engines}
mkdir -p "$out"
cargo fetch --quiet
for engine in redb rocksdb; do
    rm -rf "$out/target-$engine"
    /usr/bin/time -f "{\"build\":\"$engine\",\"wall_s\":%e,\"user_s\":%U,\"sys_s\":%S}" \
        cargo build --release --quiet --features "$engine" --target-dir "$out/target-$engine" 2>&1 | tail -1
done
cargo build --release --quiet --features redb,rocksdb --target-dir "$out/target-rocksdb"
"$out/target-rocksdb/release/storage-engines" "${@:-20000}"
