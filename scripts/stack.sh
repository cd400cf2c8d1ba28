#!/usr/bin/env bash
# Installs the node stack users run today, from the upstream projects' Go modules at pinned
# versions, into a cache outside the checkout keyed by those versions:
#   containerd 2.3 (with its ctr and its runc shim, the comparison), runc 1.4, cri-tools
#   (crictl, critest), CRI-O (crio, pinns; conmon comes from Debian) and the CNI plugins.
#
#   scripts/stack.sh          install what is missing, then print the versions
#   scripts/stack.sh --dir    print the bin directory only (tests and scripts read it)
#
# Idempotent: a second run finds every binary and costs a second. Nothing of the upstream
# projects is committed or vendored: `go install module/cmd/x@version` fetches them from the Go
# module proxy into the module cache (GOMODCACHE, outside the checkout). critest is a Ginkgo
# test binary and pinns is C, so both are built from their module's own directory in that cache
# (read-only: the output goes to the stack's bin directory).
#
# Pins, and why where a version is not the newest upstream:
#   containerd v2.3.7   the LTS line's newest patch the proxy serves
#   runc       v1.4.4
#   cri-tools  v1.37.0
#   CRI-O      v1.34.0  the proxy refuses every 1.35-1.37 release (403); 1.34.0 is the newest served
#   CNI        v1.6.2
set -euo pipefail
cd "$(dirname "$0")/.."

CONTAINERD=v2.3.7
RUNC=v1.4.4
CRI_TOOLS=v1.37.0
CRIO=v1.34.0
CNI=v1.6.2

key=$(printf '%s\n' "$CONTAINERD" "$RUNC" "$CRI_TOOLS" "$CRIO" "$CNI" | sha256sum | cut -c1-12)
root=${GANTRY_STACK_CACHE:-/var/cache/gantry-stack}
dir=$root/$key
bin=$dir/bin

if [ "${1:-}" = --dir ]; then
  echo "$bin"
  exit 0
fi

need_pkgs=()
command -v go >/dev/null 2>&1 || export PATH=$PATH:/usr/local/go/bin
# These modules need Go 1.26 (containerd 2.3's go.mod says 1.26.8); Debian's golang-go is
# older, so Go comes from go.dev's tarball in /usr/local/go, as on this project's machines.
if ! go version 2>/dev/null | grep -qE 'go1\.(2[6-9]|[3-9][0-9])'; then
  echo "stack: Go 1.26 or newer is needed (found: $(go version 2>/dev/null || echo none))" >&2
  exit 1
fi
for pair in gcc:gcc pkg-config:pkg-config conmon:conmon; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_pkgs+=("${pair#*:}")
done
dpkg -s libseccomp-dev >/dev/null 2>&1 || need_pkgs+=(libseccomp-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "stack: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

mkdir -p "$bin"
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
# Builds only what is missing; every step writes into $bin, so an interrupted run resumes.
step() {
  local name=$1
  shift
  [ -x "$bin/$name" ] && return 0
  local t0=$SECONDS
  echo "stack: building $name"
  "$@"
  [ -x "$bin/$name" ] || { echo "stack: $name was not built" >&2; exit 1; }
  echo "stack: $name built in $((SECONDS - t0)) s"
}
install_go() { GOBIN=$bin go install "$@"; }
# The module's directory in the module cache (downloaded if missing).
module_dir() { go mod download -json "$1" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p'; }

ldflags_containerd="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD"
for cmd in containerd ctr containerd-shim-runc-v2; do
  # no_btrfs: the btrfs snapshotter needs btrfs headers the tests never use.
  step "$cmd" install_go -tags no_btrfs -ldflags "$ldflags_containerd" \
    "github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD"
done
step runc install_go -tags seccomp -ldflags "-X main.version=${RUNC#v}" \
  "github.com/opencontainers/runc@$RUNC"
step crictl install_go -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS" \
  "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS"
build_critest() {
  local src
  src=$(module_dir "sigs.k8s.io/cri-tools@$CRI_TOOLS")
  (cd "$src" && go test -c -o "$bin/critest" \
    -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS" ./cmd/critest)
}
step critest build_critest
# CRI-O's own build tags minus the C libraries the tests do not use (gpgme, btrfs,
# devicemapper); seccomp stays on, as on a production node.
crio_tags="containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper btrfs_noversion libdm_no_deferred_remove seccomp"
# Built from the module's own directory: `go install` of CRI-O stops at the proxy's refusal to
# list the module's versions, while the pinned version itself is served.
build_crio() {
  local src
  src=$(module_dir "github.com/cri-o/cri-o@$CRIO")
  (cd "$src" && go build -mod=mod -tags "$crio_tags" -o "$bin/crio" ./cmd/crio)
}
step crio build_crio
build_pinns() {
  local src
  src=$(module_dir "github.com/cri-o/cri-o@$CRIO")
  gcc -O2 -std=c99 -Wall -o "$bin/pinns" "$src"/pinns/src/*.c
}
step pinns build_pinns
cni=()
for p in main/bridge main/ptp main/loopback ipam/host-local meta/portmap; do
  cni+=("github.com/containernetworking/plugins/plugins/$p@$CNI")
done
mkdir -p "$dir/cni"
[ -x "$dir/cni/portmap" ] || { echo "stack: building the CNI plugins"; GOBIN=$dir/cni go install "${cni[@]}"; }

echo "stack: $bin"
echo "stack: containerd $("$bin/containerd" --version | awk '{print $3}'), runc $("$bin/runc" --version | awk 'NR==1{print $3}'), crictl $("$bin/crictl" --version | awk '{print $3}'), crio $("$bin/crio" --version 2>/dev/null | awk 'NR==1{print $3}'), CNI $CNI, conmon $(conmon --version | awk 'NR==1{print $3}')"
