#!/usr/bin/env bash
# A Docker engine and the images the test fixtures name, without a registry.
#
#   source scripts/docker.sh && docker_up      # or: scripts/docker.sh
#
# - installs Debian's docker.io when no dockerd is found (apt);
# - starts dockerd in the background when none answers (no systemd needed),
#   confined: no iptables rules, no IP forwarding or masquerading, published
#   ports bound to 127.0.0.1 only (/etc/docker/daemon.json);
# - pulls the images the fixtures ask for when a registry answers, else builds
#   them from this machine's own servers and the libraries they load (no
#   registry, no network inside a build): `redis:7-alpine` (redis-server, redis-cli),
#   `quay.io/coreos/etcd:v3.5.17` (etcd) and `rollcall/moto-serialized:5.2.1` (Python,
#   moto's wheels downloaded by pip on the host, and scripts/moto_serialized.py).
# Idempotent; a machine with a running engine and the official images skips
# every step. Needs root (apt, dockerd) the first time.
set -euo pipefail

DOCKER_LOG=${DOCKER_LOG:-/tmp/rollcall-dockerd.log}

docker_install() {
  if command -v dockerd >/dev/null 2>&1 || docker info >/dev/null 2>&1; then
    return 0
  fi
  echo "[docker] installing docker.io"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null; }
}

docker_start() {
  if docker info >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p /etc/docker
  if [ ! -f /etc/docker/daemon.json ]; then
    cat >/etc/docker/daemon.json <<'JSON'
{"iptables": false, "ip6tables": false, "ip-forward": false, "ip-masq": false, "ip": "127.0.0.1"}
JSON
  fi
  echo "[docker] starting dockerd (log: $DOCKER_LOG)"
  nohup dockerd >"$DOCKER_LOG" 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "[docker] dockerd did not answer within 30 s; its log:" >&2
  tail -20 "$DOCKER_LOG" >&2
  return 1
}

# Copies each binary and every library it loads (ldd) into the root $1.
_copy_with_libs() {
  local root=$1
  shift
  local f dep
  for f in "$@"; do
    mkdir -p "$root$(dirname "$f")"
    cp -L "$f" "$root$f"
    for dep in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
      if [ -e "$dep" ] && [ ! -e "$root$dep" ]; then
        mkdir -p "$root$(dirname "$dep")"
        cp -L "$dep" "$root$dep"
      fi
    done
  done
}

# Copies into the root $1 the libraries the shared objects under $2 load.
_copy_libs_under() {
  local root=$1 dir=$2 so dep
  while IFS= read -r so; do
    for dep in $(ldd "$so" 2>/dev/null | grep -o '/[^ ]*' | sort -u); do
      if [ -e "$dep" ] && [ ! -e "$root$dep" ]; then
        mkdir -p "$root$(dirname "$dep")"
        cp -L "$dep" "$root$dep"
      fi
    done
  done < <(find "$dir" -name '*.so*' -type f)
}

# Imports the root $1 as image $2 with the `docker import --change`s after it.
_import() {
  local root=$1 image=$2
  shift 2
  mkdir -p "$root/tmp" "$root/data"
  chmod 1777 "$root/tmp"
  tar -C "$root" -c . | docker import "$@" - "$image" >/dev/null
  echo "[docker] built $image from this machine's files"
}

_have_image() {
  docker image inspect "$1" >/dev/null 2>&1
}

# Pulls image $1 when a registry answers (within 30 s); fails quietly otherwise.
_pull() {
  timeout 30 docker pull -q "$1" >/dev/null 2>&1
}

docker_images() {
  local root
  if ! _have_image redis:7-alpine && ! _pull redis:7-alpine; then
    command -v redis-server >/dev/null || { echo "[docker] redis-server is needed to build redis:7-alpine" >&2; return 1; }
    root=$(mktemp -d)
    _copy_with_libs "$root" "$(command -v redis-server)" "$(command -v redis-cli)"
    _import "$root" redis:7-alpine \
      --change 'WORKDIR /data' \
      --change 'CMD ["redis-server", "--protected-mode", "no"]'
    rm -rf "$root"
  fi
  if ! _have_image quay.io/coreos/etcd:v3.5.17 && ! _pull quay.io/coreos/etcd:v3.5.17; then
    command -v etcd >/dev/null || { echo "[docker] etcd is needed to build the etcd image" >&2; return 1; }
    root=$(mktemp -d)
    _copy_with_libs "$root" "$(command -v etcd)"
    mkdir -p "$root/usr/local/bin"
    ln -sf "$(command -v etcd)" "$root/usr/local/bin/etcd"
    _import "$root" quay.io/coreos/etcd:v3.5.17 \
      --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
      --change 'WORKDIR /data' \
      --change 'CMD ["etcd"]'
    rm -rf "$root"
  fi
  # DynamoDB: AWS's DynamoDB Local when a registry has it (the fixtures prefer
  # it), else moto behind the serializing wrapper, built here.
  if ! _have_image amazon/dynamodb-local:2.5.4 && ! _pull amazon/dynamodb-local:2.5.4 \
    && ! _have_image rollcall/moto-serialized:5.2.1; then
    local py=/usr/bin/python3.11
    [ -x "$py" ] || { echo "[docker] $py is needed to build the moto image" >&2; return 1; }
    root=$(mktemp -d)
    _copy_with_libs "$root" "$py"
    mkdir -p "$root/usr/lib"
    cp -a /usr/lib/python3.11 "$root/usr/lib/"
    _copy_libs_under "$root" "$root/usr/lib/python3.11"
    # moto's wheels for this Python (3.11), installed by the host's pip.
    local pip=(python3 -m pip)
    "${pip[@]}" install -q --disable-pip-version-check --no-warn-script-location \
      --python-version 3.11 --only-binary=:all: --target "$root/opt/moto" 'moto[server]==5.2.1' \
      2>/dev/null \
      || "${pip[@]}" install -q --disable-pip-version-check --target "$root/opt/moto" 'moto[server]==5.2.1' 2>&1 \
        | grep -v "dependency resolver\|requires\|root' user" || true
    _copy_libs_under "$root" "$root/opt/moto"
    # moto's DynamoDB is not atomic under concurrent requests: the same
    # serializing wrapper the local fixture runs.
    cp "$(dirname "${BASH_SOURCE[0]}")/moto_serialized.py" "$root/opt/moto_serialized.py"
    mkdir -p "$root/etc/ssl/certs"
    _import "$root" rollcall/moto-serialized:5.2.1 \
      --change 'ENV PYTHONPATH=/opt/moto' \
      --change 'ENV PATH=/usr/bin:/bin' \
      --change 'EXPOSE 5000' \
      --change 'ENTRYPOINT ["/usr/bin/python3.11", "/opt/moto_serialized.py", "-H", "0.0.0.0"]' \
      --change 'CMD ["-p", "5000"]'
    rm -rf "$root"
  fi
}

docker_up() {
  docker_install
  docker_start
  docker_images
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  docker_up
fi
