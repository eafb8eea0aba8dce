#!/usr/bin/env bash
# Builds the real Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler), etcd, kwok and
# kwokctl from the Go module proxy into a cache outside the repository, keyed by version, so a second run is instant.
# Prints the directory holding the binaries as its last line.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io/* staging module with ./staging and
# requires v0.0.0. A throwaway module requires k8s.io/kubernetes and replaces each staging module with its published
# v0.X.Y twin instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${SLOTUNE_CACHE:-$HOME/.cache/slotune}
bin="$cache/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
wanted=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok kwokctl)

have_all() { for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
if have_all; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "go is required to build the control plane" >&2; exit 1; }
start=$(date +%s)
mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0

build_kubernetes() {
  local minor=${K8S_VERSION#v1.} staging_version
  minor=${minor%%.*}
  staging_version="v0.${K8S_VERSION#v1.}"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init slotune.local/k8sbuild >/dev/null 2>&1
  go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
  # Every staging module named in that release's go.mod, pointed at its published twin.
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  local gomod
  gomod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod
  grep -oE 'k8s.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | sort -u | while read -r mod; do
    go mod edit -replace "$mod=$mod@$staging_version"
  done
  cat > tools.go <<GO
//go:build tools
package tools
import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy -e >/dev/null 2>&1 || true
  local pkg ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$bin/$b" ] && continue
    echo "building $b $K8S_VERSION ..." >&2
    go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/$b" "k8s.io/kubernetes/cmd/$b"
  done
}

build_etcd() {
  [ -x "$bin/etcd" ] && return
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init slotune.local/etcdbuild >/dev/null 2>&1
  cat > tools.go <<GO
//go:build tools
package tools
import _ "go.etcd.io/etcd/server/v3"
GO
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
  go mod tidy -e >/dev/null 2>&1 || true
  echo "building etcd $ETCD_VERSION ..." >&2
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3
}

build_kwok() {
  [ -x "$bin/kwok" ] && [ -x "$bin/kwokctl" ] && return
  echo "building kwok $KWOK_VERSION ..." >&2
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
}

build_kwok
build_etcd
build_kubernetes
have_all || { echo "control plane build incomplete in $bin" >&2; exit 1; }
echo "control plane built in $(( $(date +%s) - start )) s" >&2
echo "$bin"
