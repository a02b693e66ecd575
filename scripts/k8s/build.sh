#!/usr/bin/env bash
# Build (once per machine) a real Kubernetes v1.20.2 control plane for `make k8s-e2e`:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl, from Debian bookworm's
# `kubernetes` source package (the whole upstream tree with vendor/), with Debian's Go.
# etcd comes from Debian's etcd-server package. Recipe: issue 20.
#
# The binaries land in ${WARMFLEET_CACHE:-~/.cache/warmfleet}/k8s-v1.20.2-<key>/bin, where <key>
# hashes the source version, the reflect2 replacement and the patches under scripts/k8s/patches.
# If that directory exists, nothing is done. The build tree lives in a temp dir outside the clone
# and is deleted afterwards (also on failure or Ctrl-C).
#
#   scripts/k8s/build.sh                  build if missing, then print the bin dir
#   scripts/k8s/build.sh --print-bin-dir  print the bin dir (built or not), nothing else
#   scripts/k8s/build.sh --deps           install the Debian packages only (apt-get; needs root)
#
# Needs root for apt-get. The deb-src entry is derived from the machine's own Debian source list
# (same URIs, components and keyring, Types: deb-src, Suites: bookworm) into a private apt
# configuration in the temp dir: the machine's apt setup is not changed and no mirror host is
# written anywhere.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_VERSION="v1.20.2"
K8S_COMMIT="faecb196815e248d3ecfb03c680a4507229c2a56"
K8S_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
REFLECT2_VERSION="1.0.2"
REFLECT2_DIR="/usr/share/gocode/src/github.com/modern-go/reflect2"
RECIPE_REVISION="1" # bump when the build recipe below changes the binaries
TARGETS="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubectl"
BINARIES="kube-apiserver kube-controller-manager kube-scheduler kubectl"
DEB_PACKAGES="golang-go etcd-server etcd-client golang-github-modern-go-reflect2-dev dpkg-dev
  rsync jq make openssl curl patch"
APT_SOURCES="${WARMFLEET_APT_SOURCES:-/etc/apt/sources.list.d/debian.sources}"

cache_key() {
  {
    printf 'kubernetes %s\nreflect2 %s\nrecipe %s\ntargets %s\n' \
      "$K8S_SRC_VERSION" "$REFLECT2_VERSION" "$RECIPE_REVISION" "$TARGETS"
    cat "$HERE"/patches/*.patch
  } | sha256sum | cut -c1-12
}

CACHE_ROOT="${WARMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmfleet}"
DEST="$CACHE_ROOT/k8s-$K8S_VERSION-$(cache_key)"
log() { echo "k8s-build: $*" >&2; }

install_deps() {
  local missing=()
  for pkg in $DEB_PACKAGES; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then
    log "missing Debian packages (apt-get needs root): ${missing[*]}"
    exit 1
  fi
  log "apt-get install ${missing[*]}"
  local apt=(apt-get -y -q -o DPkg::Lock::Timeout=600 -o Acquire::http::Timeout=60
    --no-install-recommends)
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >/dev/null \
    || { apt-get -q -o Acquire::http::Timeout=60 update >/dev/null \
      && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install "${missing[@]}" >/dev/null; }
}

# First stanza of the machine's deb822 Debian source list, as a bookworm deb-src stanza.
derive_deb_src() {
  awk 'BEGIN { RS = ""; FS = "\n" }
       NR == 1 {
         for (i = 1; i <= NF; i++) {
           line = $i
           if (line ~ /^Types:/) line = "Types: deb-src"
           else if (line ~ /^Suites:/) line = "Suites: bookworm"
           print line
         }
         exit
       }' "$APT_SOURCES"
}

case "${1:-}" in
  --print-bin-dir)
    echo "$DEST/bin"
    exit 0
    ;;
  --deps)
    install_deps
    exit 0
    ;;
  "") ;;
  *)
    echo "usage: $0 [--print-bin-dir | --deps]" >&2
    exit 2
    ;;
esac

if [[ -x "$DEST/bin/kube-apiserver" ]]; then
  log "cached: $DEST"
  echo "$DEST/bin"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.k8s-build.lock"
flock 9 # another build of the same machine finishes first; then the cache hit below
if [[ -x "$DEST/bin/kube-apiserver" ]]; then
  log "cached: $DEST"
  echo "$DEST/bin"
  exit 0
fi

start_s=$(date +%s)
install_deps
dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev | grep -q "^$REFLECT2_VERSION" \
  || { log "need golang-github-modern-go-reflect2-dev $REFLECT2_VERSION"; exit 1; }
[[ -f "$APT_SOURCES" ]] || { log "no Debian source list at $APT_SOURCES"; exit 1; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/warmfleet-k8s-build.XXXXXX")"
MAKE_PGID=""
cleanup() {
  if [[ -n "$MAKE_PGID" ]]; then
    kill -TERM -- "-$MAKE_PGID" 2>/dev/null || true
  fi
  rm -rf "$WORK" "$DEST.partial.$$"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
chmod 755 "$WORK"

# 1. the source, through a private apt configuration (deb-src derived from the machine's list)
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/parts" "$WORK/dl"
derive_deb_src >"$WORK/apt/deb-src.sources"
APT_OPTS=(-o "Dir::Etc::SourceList=$WORK/apt/deb-src.sources" -o "Dir::Etc::SourceParts=$WORK/apt/parts"
  -o "Dir::State::Lists=$WORK/apt/lists" -o Acquire::http::Timeout=60 -o Acquire::Retries=3)
log "fetching kubernetes $K8S_SRC_VERSION source"
apt-get -q "${APT_OPTS[@]}" update >/dev/null
chown _apt "$WORK/dl" 2>/dev/null || true
(cd "$WORK/dl" && apt-get -q "${APT_OPTS[@]}" --download-only source \
  "kubernetes=$K8S_SRC_VERSION" >/dev/null)
# apt checked the .dsc against the signed Sources index; dpkg-source's own signature warning is noise
dpkg-source -x "$WORK/dl/kubernetes_$K8S_SRC_VERSION.dsc" "$WORK/src" >/dev/null 2>"$WORK/unpack.log" \
  || { cat "$WORK/unpack.log" >&2; exit 1; }
rm -rf "$WORK/dl"
SRC="$WORK/src"

# 2. patch 1: reflect2 1.0.1 segfaults on Go >= 1.18; Debian's 1.0.2 replaces it
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
mkdir -p "$SRC/vendor/github.com/modern-go/reflect2"
cp "$REFLECT2_DIR"/*.go "$REFLECT2_DIR"/*.s "$SRC/vendor/github.com/modern-go/reflect2/"
# patch 2..n: the files under scripts/k8s/patches
for p in "$HERE"/patches/*.patch; do
  patch -d "$SRC" -p1 --forward --quiet <"$p"
done

# 3. the tree's own make, GOPATH mode, no network, 2 compile jobs, low priority
cat >"$WORK/version" <<EOF
KUBE_GIT_VERSION='$K8S_VERSION'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_COMMIT='$K8S_COMMIT'
EOF
log "compiling $TARGETS with $(go version | cut -d' ' -f3) (10-20 min on 2 cores)"
setsid env -u GOFLAGS GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0 GOCACHE="$WORK/gocache" \
  nice -n 10 make -C "$SRC" WHAT="$TARGETS" KUBE_GIT_VERSION_FILE="$WORK/version" \
  GOFLAGS=-p=2 >"$WORK/make.log" 2>&1 &
MAKE_PGID=$!
if ! wait "$MAKE_PGID"; then
  MAKE_PGID=""
  tail -n 40 "$WORK/make.log" >&2
  log "make failed"
  exit 1
fi
MAKE_PGID=""

# 4. publish atomically into the cache
OUT="$SRC/_output/bin"
mkdir -p "$DEST.partial.$$/bin"
for b in $BINARIES; do
  install -m 0755 "$OUT/$b" "$DEST.partial.$$/bin/$b"
done
"$DEST.partial.$$/bin/kube-apiserver" --version | grep -q "Kubernetes $K8S_VERSION"
end_s=$(date +%s)
{
  echo "kubernetes_source=$K8S_SRC_VERSION"
  echo "version=$K8S_VERSION"
  echo "go=$(go version | cut -d' ' -f3)"
  echo "build_seconds=$((end_s - start_s))"
  echo "built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$DEST.partial.$$/build-info"
mv "$DEST.partial.$$" "$DEST"
log "built $DEST in $((end_s - start_s)) s ($(du -sh "$DEST" | cut -f1))"
echo "$DEST/bin"
