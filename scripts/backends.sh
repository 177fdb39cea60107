#!/usr/bin/env bash
# Installs and starts the real backends rollcall's provider tests run against:
# redis-server, etcd and moto_server (DynamoDB API), each on a free loopback port.
#
#   source scripts/backends.sh && backends_install && backends_start
#   ... ROLLCALL_REDIS_URL / ROLLCALL_REDIS_CLUSTER_URL / ROLLCALL_ETCD_ENDPOINTS /
#       ROLLCALL_ETCD_CLUSTER_ENDPOINTS / ROLLCALL_DYNAMODB_ENDPOINT are exported ...
#   backends_stop
#
# Installs with apt-get (Debian packages redis-server, redis-tools, etcd-server,
# protobuf-compiler, libprotobuf-dev, libfaketime, ...) when root, and moto[server] with pip into ./.venv.
# Not root and something missing: prints what to install, or how to use Docker
# instead (cargo test --features rollcall-tests/docker with a running Docker daemon).

ROLLCALL_ROOT=${ROLLCALL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
BACKENDS_DIR="$ROLLCALL_ROOT/.backends"
BACKEND_PIDS=()

backends_log() { echo "[backends] $*" >&2; }

backends_install() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  # etcd-client's build compiles etcd's protos, which import protobuf's well-known types.
  [ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  # The dashboard's browser test: headless Chromium driven through ChromeDriver,
  # with one font so that screenshots show text.
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  [ -d /usr/share/fonts/truetype/dejavu ] || missing+=(fonts-dejavu-core)
  # The partition tests: network namespaces, a bridge and blackhole routes.
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  # The carts clock test steps one real process's wall clock (LD_PRELOAD).
  [ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || missing+=(libfaketime)
  if ((${#missing[@]})); then
    if [ "$(id -u)" = 0 ]; then
      backends_log "installing ${missing[*]} with apt-get"
      apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      backends_log "missing ${missing[*]} and not root: install them with your package manager"
      backends_log "or, with a Docker daemon running: cargo test --workspace --all-features (the fixtures use testcontainers)"
      return 1
    fi
  fi
  # Debian's etcd-server package starts a system etcd on 2379; ours use their own ports.
  if [ ! -x "$ROLLCALL_ROOT/.venv/bin/moto_server" ]; then
    backends_log "installing moto[server] into .venv"
    python3 -m venv "$ROLLCALL_ROOT/.venv"
    "$ROLLCALL_ROOT/.venv/bin/pip" install -q --disable-pip-version-check 'moto[server,dynamodb]>=5,<6'
  fi
}

# COUNT distinct free loopback ports in LOW..HIGH, all held at once while they are
# picked (two picks can never be the same port); with BUS, port P+BUS must be free
# too and is held as well (a Redis Cluster node's bus port), so no pick is another's
# bus port. Plain ports come from 10000-19999, cluster ports from 20000-29999 with
# their buses at 30000-39999: below Linux's ephemeral range (32768-60999) as far
# as possible, so an outgoing connection rarely takes one between the pick and the
# server's bind (backends_start retries when one does).
backends_free_ports() { # count [low high [bus]]
  python3 - "$1" "${2:-10000}" "${3:-19999}" "${4:-0}" <<'PY'
import random, socket, sys
n, low, high, bus = map(int, sys.argv[1:5])
held, ports = [], []
while len(ports) < n:
    p = random.randint(low, high)
    if p in ports:
        continue
    taken = []
    try:
        for q in (p, p + bus) if bus else (p,):
            s = socket.socket()
            taken.append(s)
            s.bind(("127.0.0.1", q))
    except OSError:
        for s in taken:
            s.close()
        continue
    held.extend(taken)
    ports.append(p)
print(" ".join(map(str, ports)))
PY
}

backends_wait_port() { # port name
  local i
  for i in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  backends_log "$2 did not open port $1; its log:"
  cat "$BACKENDS_DIR/$2.log" >&2 || true
  return 1
}

backends_wait_etcd_health() { # port: until the member has a leader
  python3 - "$1" <<'PY' || { backends_log "etcd on port $1 never became healthy"; return 1; }
import sys, time, urllib.request
for _ in range(300):
    try:
        if b'"health":"true"' in urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read():
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
PY
}

# Starts every backend (see the top of this file) and exports their addresses. A
# port taken by another process between the pick and the bind fails one attempt:
# the backends are stopped and started again on other ports, 3 attempts in all.
backends_start() {
  local attempt
  for attempt in 1 2 3; do
    backends_start_once && return 0
    backends_log "backends did not all start (attempt $attempt of 3); stopping them, trying other ports"
    backends_stop
  done
  return 1
}

backends_start_once() {
  rm -rf "$BACKENDS_DIR"
  mkdir -p "$BACKENDS_DIR"
  local ports rp ep pp mp
  read -r -a ports <<<"$(backends_free_ports 10)"
  rp=${ports[0]} ep=${ports[1]} pp=${ports[2]} mp=${ports[3]}
  redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no --dir "$BACKENDS_DIR" \
    >"$BACKENDS_DIR/redis.log" 2>&1 &
  BACKEND_PIDS+=($!)
  etcd --name rollcall-test --data-dir "$BACKENDS_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ep" --advertise-client-urls "http://127.0.0.1:$ep" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "rollcall-test=http://127.0.0.1:$pp" >"$BACKENDS_DIR/etcd.log" 2>&1 &
  BACKEND_PIDS+=($!)
  # One request at a time: see the script (moto's own server lets two
  # transactions both commit).
  "$ROLLCALL_ROOT/.venv/bin/python3" "$ROLLCALL_ROOT/scripts/moto_serialized.py" -H 127.0.0.1 -p "$mp" >"$BACKENDS_DIR/moto.log" 2>&1 &
  BACKEND_PIDS+=($!)
  # A 3-member etcd cluster for the etcd conformance run on a real quorum.
  local eports=() epeers=() einitial="" j
  for j in 0 1 2; do
    eports+=("${ports[$((4 + j))]}"); epeers+=("${ports[$((7 + j))]}")
    einitial+="m$j=http://127.0.0.1:${epeers[$j]},"
  done
  for j in 0 1 2; do
    etcd --name "m$j" --data-dir "$BACKENDS_DIR/etcd-m$j" \
      --listen-client-urls "http://127.0.0.1:${eports[$j]}" --advertise-client-urls "http://127.0.0.1:${eports[$j]}" \
      --listen-peer-urls "http://127.0.0.1:${epeers[$j]}" --initial-advertise-peer-urls "http://127.0.0.1:${epeers[$j]}" \
      --initial-cluster "${einitial%,}" --initial-cluster-state new \
      --heartbeat-interval 50 --election-timeout 500 >"$BACKENDS_DIR/etcd-m$j.log" 2>&1 &
    BACKEND_PIDS+=($!)
  done
  # A 3-master Redis Cluster for the cluster-mode conformance run.
  local cports=() cp i
  read -r -a cports <<<"$(backends_free_ports 3 20000 29999 10000)"
  for i in 1 2 3; do
    cp=${cports[$((i - 1))]}
    mkdir -p "$BACKENDS_DIR/rc$i"
    redis-server --port "$cp" --bind 127.0.0.1 --save "" --appendonly no --cluster-enabled yes \
      --cluster-node-timeout 5000 --dir "$BACKENDS_DIR/rc$i" >"$BACKENDS_DIR/redis-cluster-$i.log" 2>&1 &
    BACKEND_PIDS+=($!)
  done
  backends_wait_port "$rp" redis && backends_wait_port "$ep" etcd && backends_wait_port "$mp" moto || return 1
  for cp in "${cports[@]}"; do backends_wait_port "$cp" "redis-cluster" || return 1; done
  for j in 0 1 2; do backends_wait_port "${eports[$j]}" "etcd-m$j" || return 1; done
  for j in 0 1 2; do backends_wait_etcd_health "${eports[$j]}" || return 1; done
  backends_wait_etcd_health "$ep" || return 1
  redis-cli --cluster create "${cports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes \
    >"$BACKENDS_DIR/redis-cluster-create.log" 2>&1 || { cat "$BACKENDS_DIR/redis-cluster-create.log" >&2; return 1; }
  for cp in "${cports[@]}"; do
    for i in $(seq 1 100); do
      redis-cli -p "$cp" cluster info 2>/dev/null | grep -q cluster_state:ok && break
      sleep 0.1
    done
  done
  local cluster_nodes
  cluster_nodes=$(printf '127.0.0.1:%s,' "${cports[@]}")
  export ROLLCALL_REDIS_CLUSTER_URL="redis+cluster://${cluster_nodes%,}"
  export ROLLCALL_REDIS_URL="redis://127.0.0.1:$rp"
  export ROLLCALL_ETCD_ENDPOINTS="127.0.0.1:$ep"
  local etcd_cluster
  etcd_cluster=$(printf '127.0.0.1:%s,' "${eports[@]}")
  export ROLLCALL_ETCD_CLUSTER_ENDPOINTS="${etcd_cluster%,}"
  export ROLLCALL_DYNAMODB_ENDPOINT="http://127.0.0.1:$mp"
  # moto accepts any credentials, but the AWS SDK's chain must find some.
  export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-rollcall-local}"
  export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-rollcall-local}"
  export PATH="$ROLLCALL_ROOT/.venv/bin:$PATH"
  backends_log "redis $ROLLCALL_REDIS_URL, redis cluster $ROLLCALL_REDIS_CLUSTER_URL, etcd $ROLLCALL_ETCD_ENDPOINTS, etcd cluster $ROLLCALL_ETCD_CLUSTER_ENDPOINTS, dynamodb (moto) $ROLLCALL_DYNAMODB_ENDPOINT"
}

backends_stop() {
  local pid
  for pid in "${BACKEND_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${BACKEND_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  BACKEND_PIDS=()
}
