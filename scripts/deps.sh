#!/usr/bin/env bash
# Installs what gantry's build, demo and tests need on a fresh Debian machine, skipping what is
# already there: containerd 1.6, runc, crun, criu, busybox-static, protoc (for the CRI test
# client), script (tty tests), libseccomp-dev, promtool (Debian's prometheus package: the
# metrics tests check the exporter's output with `promtool check metrics`), skopeo (the image
# test reads scripts/image.sh's archive with `skopeo inspect oci-archive:`), systemd (a manager
# the systemd-driver sandbox test starts; it does not become PID 1); and on a hybrid cgroup
# host binds hugetlb to a v1 hierarchy, which crun needs.
set -euo pipefail

need=()
for pair in containerd:containerd ctr:containerd runc:runc crun:crun criu:criu \
            busybox:busybox-static pkg-config:pkg-config protoc:protobuf-compiler script:bsdutils promtool:prometheus skopeo:skopeo; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
# A dynamic busybox cannot serve as a container's whole userland.
if command -v busybox >/dev/null 2>&1 && ! { ldd "$(command -v busybox)" 2>&1 || true; } | grep -q 'not a dynamic'; then
  need+=(busybox-static)
fi
dpkg -s libseccomp-dev >/dev/null 2>&1 || need+=(libseccomp-dev)
# PyYAML for scripts/check-manifests.py (the Kubernetes manifests, checked in CI).
dpkg -s python3-yaml >/dev/null 2>&1 || need+=(python3-yaml)
# systemd's manager binary (not as PID 1): the sandbox tests' systemd cgroup driver runs one.
[ -x /lib/systemd/systemd ] || need+=(systemd)
# ... and the user D-Bus it socket-activates (the test binds it where the system bus lives).
dpkg -s dbus-user-session >/dev/null 2>&1 || need+=(dbus-user-session)

if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  # Only promtool is wanted from the prometheus package, not a server on the machine.
  if printf '%s\n' "${need[@]}" | grep -qx prometheus; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "deps: cargo not found; install a Rust toolchain (rustup) first" >&2
  exit 1
fi
# This project's VMs run a hybrid cgroup layout whose unified hierarchy holds only hugetlb;
# crun refuses that layout until hugetlb is bound to a v1 hierarchy. (Left bound afterwards:
# it is host setup, like the packages above, and other users may rely on it.)
if [ -d /sys/fs/cgroup/unified ] && [ ! -e /sys/fs/cgroup/hugetlb/tasks ]; then
  mkdir -p /sys/fs/cgroup/hugetlb 2>/dev/null || true
  mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb 2>/dev/null || true
fi
