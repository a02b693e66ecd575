#!/usr/bin/env bash
# promtool, Prometheus's rule checker and rule unit-test runner, for tests/deploy: taken from
# Debian's `prometheus` package once per machine (`apt-get download`, then `dpkg-deb -x`; nothing
# is installed on the system) into ${WARMFLEET_CACHE:-~/.cache/warmfleet}/promtool-<version>/.
# Prints the binary's path. Needs the machine's apt package lists (`apt-get update` as root if
# they are missing, which this script does when it runs as root).
set -euo pipefail

CACHE_ROOT="${WARMFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmfleet}"

candidate() {
  apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}'
}

version="$(candidate)"
if [[ -z "$version" || "$version" == "(none)" ]] && [[ "$(id -u)" == 0 ]]; then
  apt-get update -qq >&2
  version="$(candidate)"
fi
if [[ -z "$version" || "$version" == "(none)" ]]; then
  echo "promtool.sh: apt knows no 'prometheus' package (run apt-get update as root)" >&2
  exit 1
fi

dest="$CACHE_ROOT/promtool-${version//[^A-Za-z0-9.+-]/_}"
if [[ ! -x "$dest/promtool" ]]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get download -q "prometheus=$version" >&2)
  dpkg-deb -x "$work"/prometheus_*.deb "$work/x"
  mkdir -p "$dest"
  install -m 0755 "$work/x/usr/bin/promtool" "$dest/promtool.tmp"
  mv "$dest/promtool.tmp" "$dest/promtool"
fi
echo "$dest/promtool"
