#!/usr/bin/env bash
# node-vm.sh: runs a command inside a production-shaped Kubernetes-node-like VM: Debian 12
# (bookworm) with systemd as PID 1, cgroup v2 (unified), AppArmor enabled, full capabilities
# and containerd running as its normal systemd service (Type=notify). It is for the tests that
# a container or a plain root shell on a dev box cannot do honestly (systemd cgroup driver under
# a real PID 1, AppArmor profiles, a real containerd restart, ...).
#
#   scripts/node-vm.sh build
#       Builds the guest image from Debian's packages only (debootstrap from
#       http://deb.debian.org/debian) into $GANTRY_NODE_CACHE (default /var/cache/gantry-node),
#       keyed by a hash of the package list, SCRIPT_VERSION and the in-guest setup. A machine
#       that already has the image for the current key does nothing ("image up to date").
#   scripts/node-vm.sh run [--timeout SECONDS] [--share HOSTDIR]... -- CMD...
#       Builds the image if needed, boots a throwaway qcow2 overlay of it (the cached image is
#       never written), and runs CMD as root with `bash -c` in the guest, cwd = this checkout's
#       root. One CMD word is taken as a shell script ('make && ./x | y'); several words are
#       quoted into one command line, argv kept. The checkout root and each --share HOSTDIR are
#       shared over virtio-9p, read-write, at the SAME absolute path in the guest (tests bake
#       in CARGO_MANIFEST_DIR / CARGO_BIN_EXE_* paths). CMD's stdout+stderr stream to this
#       script's stdout; node-vm's own messages go to stderr. Exits with CMD's exit status, 124
#       on timeout (default 1800 s; qemu is killed, the serial log's tail printed), 125 when
#       the VM failed before CMD reported a status. The serial (boot) log of the last run is
#       kept at $GANTRY_NODE_CACHE/last-serial.log.
#   scripts/node-vm.sh clean
#       Removes the cache (images and the .deb cache).
#
# Environment: GANTRY_NODE_CACHE (cache folder), GANTRY_NODE_ACCEL=kvm|tcg (default: kvm only
# when /dev/kvm is usable AND the CPU flags show vmx/svm: the paravirtual /dev/kvm of some
# cloud VMs has neither and a stock kernel dies under it with "emulation failure"),
# GANTRY_NODE_CPUS (default nproc), GANTRY_NODE_MEM_MB (default 4096), GANTRY_NODE_9P_CACHE
# (9p cache mode of the shares, default mmap: executables run from the share, and writes reach
# the host at once).
#
# Options go before CMD: everything from the first non-option word (or after --) is CMD.
#
# Guest notes: keep Unix sockets under /run or /tmp of the guest, not on a 9p share (9p does not
# reliably support binding and connecting them). Guest writes to / (containerd's /var/lib/containerd, ...) go to the
# throwaway overlay and are gone after the run. No network inside (-nic none).
#
# Measured on a 2-core cloud VM without usable nested virtualisation (TCG, 2 vCPUs), Debian 12
# host, with a cargo build competing for the cores:
#   build, cold (debootstrap downloads ~160 .debs, 150 MB):  ~135-180 s
#   build, .debs cached (a key change):                      ~140 s (dpkg, not the download,
#                                                              is the cost)
#   build, image up to date:                                 ~0.01 s
#   run: the guest command starts ~19-30 s after qemu (kernel+initrd ~8 s, then apparmor
#   ~4 s and containerd ~4 s on the critical path), poweroff ~1 s: `run -- true` ~21 s.
set -euo pipefail

# Bump to force a rebuild when something the key does not see changes (e.g. host tooling).
SCRIPT_VERSION=1
MIRROR=http://deb.debian.org/debian
SUITE=bookworm
DISK_SIZE=8G
# Guest packages on top of debootstrap's minbase (required-priority packages). Recommends are
# not installed (debootstrap never does), which keeps the image small.
PACKAGES=(
  systemd systemd-sysv dbus udev kmod linux-image-amd64
  apparmor containerd runc crun criu libseccomp2 conmon nftables
  busybox-static iproute2 procps util-linux bsdutils libcap2-bin
)
# Host commands the script needs, and the Debian package each comes from.
HOST_TOOLS=(debootstrap:debootstrap qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils
            mkfs.ext4:e2fsprogs flock:util-linux)

CACHE=${GANTRY_NODE_CACHE:-/var/cache/gantry-node}
RESULTS_TAG=gantry-results

log() { printf 'node-vm: %s\n' "$*" >&2; }
die() { log "$*"; exit "${2:-1}"; }
now_ms() { date +%s%3N; }
# secs_since START_MS: elapsed seconds with one decimal.
secs_since() { local d=$(( $(now_ms) - $1 )); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

usage() {
  cat >&2 <<'USAGE'
usage: scripts/node-vm.sh build
       scripts/node-vm.sh run [--timeout SECONDS] [--share HOSTDIR]... -- CMD...
       scripts/node-vm.sh clean
USAGE
  exit 2
}

# ---------------------------------------------------------------------------------------------
# Host side: tools, cache, lock.

ensure_host_tools() {
  local pair cmd need=()
  for pair in "${HOST_TOOLS[@]}"; do
    cmd=${pair%%:*}
    command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" >/dev/null 2>&1 \
      || need+=("${pair#*:}")
  done
  # mkfs.ext4 -d (populate from a directory) needs e2fsprogs >= 1.43.
  local help
  help=$(mke2fs -h 2>&1 || true)
  case $help in *'[-d '*) ;; *) need+=(e2fsprogs) ;; esac
  [ ${#need[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "needs root to install ${need[*]}"
  log "installing host packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
}

# lock_cache: serialises builds, prunes and cleans of one cache folder (held until exit).
lock_cache() {
  mkdir -p "$CACHE"
  exec {lock_fd}>"$CACHE/.lock"
  flock "$lock_fd"
}

# image_key: changes whenever anything baked into the image changes.
image_key() {
  {
    echo "$SCRIPT_VERSION $MIRROR $SUITE $DISK_SIZE"
    printf '%s\n' "${PACKAGES[@]}"
    declare -f configure_rootfs guest_runner guest_unit
  } | sha256sum | cut -c1-16
}

image_dir() { echo "$CACHE/images/$(image_key)"; }

# ---------------------------------------------------------------------------------------------
# What gets baked into the guest. These functions are part of the image key.

# guest_runner: the script gantry-node.service runs. The host puts the command, its cwd and the
# list of shares (TAG PATH per line) into the results share; the runner mounts the shares,
# runs the command with its output in the results share (the host tails it), and leaves its
# exit status in results/rc. The unit's SuccessAction/FailureAction power the VM off.
guest_runner() {
  cat <<'RUNNER'
#!/bin/bash
set -u
res=/run/gantry-results
# 512000: the most the 6.1 virtio transport takes (it clamps larger values to it).
opts=trans=virtio,version=9p2000.L,msize=512000
# Modules, not built in, in Debian's kernel; mount would load 9p itself, but not always the
# virtio transport early enough.
modprobe -a 9pnet_virtio 9p
mkdir -p "$res"
# The results share is uncached: every write reaches the host at once (it tails output).
mount -t 9p -o "$opts" gantry-results "$res" || { echo "gantry-node: no results share" >&2; exit 1; }
cache=$(cat "$res/cache")
while read -r tag path; do
  mkdir -p "$path"
  mount -t 9p -o "$opts,cache=$cache" "$tag" "$path" || { echo "gantry-node: cannot mount $tag at $path" >&2; exit 1; }
done <"$res/shares"
: >"$res/output"
date +%s.%N >"$res/started"
echo "gantry-node: running the command" >/dev/console
rc=0
(cd "$(cat "$res/cwd")" && exec bash -c "$(cat "$res/cmd")") >"$res/output" 2>&1 </dev/null || rc=$?
echo "$rc" >"$res/rc.tmp" && mv "$res/rc.tmp" "$res/rc"
echo "gantry-node: the command exited with $rc" >/dev/console
sync
RUNNER
}

guest_unit() {
  cat <<'UNIT'
[Unit]
Description=gantry node-vm: run the host's command, then power off
# Tests expect containerd up (it is Type=notify: "After" means ready), as on a real node.
After=containerd.service apparmor.service systemd-modules-load.service local-fs.target
Wants=containerd.service
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
# exec, not oneshot: the boot transaction completes as soon as the command is running, so
# `systemctl is-system-running --wait` in a test returns as on a booted node.
Type=exec
ExecStart=/usr/local/sbin/gantry-node-run
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
WorkingDirectory=/root
TasksMax=infinity
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
UNIT
}

# configure_rootfs ROOT: turns the debootstrapped tree into the node image's content.
configure_rootfs() {
  local root=$1
  echo gantry-node >"$root/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\tgantry-node\n::1\tlocalhost ip6-localhost\n' >"$root/etc/hosts"
  # passno 0: the root is a fresh overlay each run, a boot-time fsck only costs time.
  printf '/dev/vda\t/\text4\trw,noatime,errors=remount-ro\t0\t0\n' >"$root/etc/fstab"
  : >"$root/etc/resolv.conf"
  # A fixed machine-id: without one every boot is a "first boot" (presets, firstboot).
  tr -d - </proc/sys/kernel/random/uuid >"$root/etc/machine-id"
  printf '9pnet_virtio\n9p\n' >"$root/etc/modules-load.d/gantry-node.conf"
  mkdir -p "$root/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' >"$root/etc/systemd/journald.conf.d/gantry-node.conf"
  # An initrd with just what mounts the root (virtio disk, ext4) instead of "most" modules: it
  # unpacks and probes several seconds faster under TCG.
  sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
  printf 'virtio_pci\nvirtio_blk\next4\ncrc32c_generic\n' >>"$root/etc/initramfs-tools/modules"
  mount -t proc proc "$root/proc"
  chroot "$root" update-initramfs -u -k all >/dev/null 2>&1
  umount "$root/proc"
  guest_runner >"$root/usr/local/sbin/gantry-node-run"
  chmod 755 "$root/usr/local/sbin/gantry-node-run"
  guest_unit >"$root/etc/systemd/system/gantry-node.service"
  chroot "$root" systemctl enable gantry-node.service containerd.service apparmor.service >/dev/null 2>&1
  chroot "$root" systemctl set-default multi-user.target >/dev/null 2>&1
  # Nothing logs in, nothing is updated or trimmed: these only slow the boot down.
  chroot "$root" systemctl mask getty.target serial-getty@ttyS0.service getty@tty1.service \
    apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
    man-db.timer systemd-timesyncd.service systemd-networkd-wait-online.service \
    systemd-pstore.service >/dev/null 2>&1
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/* \
    "$root"/var/log/*.log
}

# ---------------------------------------------------------------------------------------------
# build

build_tmp=
cleanup_build() {
  [ -n "$build_tmp" ] || return 0
  unmount_under "$build_tmp"
  rm -rf --one-file-system "$build_tmp"
}

# unmount_under DIR: debootstrap mounts /proc, /sys, ... in the target; an interrupted run
# leaves them behind, and rm -rf must not walk into them.
unmount_under() {
  local m
  awk -v d="$1" 'index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
}

# prune: everything under images/ but the current key (old keys, interrupted builds).
prune_images() {
  local keep=$1 d
  for d in "$CACHE"/images/* "$CACHE"/images/.build-*; do
    if [ ! -e "$d" ] || [ "$d" = "$keep" ]; then continue; fi
    log "pruning $d"
    unmount_under "$d"
    rm -rf --one-file-system "$d"
  done
}

# newest FILE...: the one with the highest version in its name.
newest() { printf '%s\n' "$@" | sort -V | tail -n 1; }

ensure_image() {
  local dir t0 root
  dir=$(image_dir)
  if [ -f "$dir/rootfs.img" ]; then log "image up to date: $dir"; return 0; fi
  [ "$(id -u)" -eq 0 ] || die "building the image needs root"
  ensure_host_tools
  lock_cache
  # Someone else may have built it while we waited for the lock.
  if [ -f "$dir/rootfs.img" ]; then log "image up to date: $dir"; return 0; fi
  prune_images "$dir"
  t0=$(now_ms)
  mkdir -p "$CACHE/images" "$CACHE/debs"
  build_tmp=$(mktemp -d "$CACHE/images/.build-XXXXXX")
  root=$build_tmp/rootfs
  log "building the image (debootstrap $SUITE from $MIRROR; log: $build_tmp/debootstrap.log)"
  local include
  include=$(IFS=,; echo "${PACKAGES[*]}")
  if ! debootstrap --variant=minbase --include="$include" --cache-dir="$CACHE/debs" \
      "$SUITE" "$root" "$MIRROR" >"$build_tmp/debootstrap.log" 2>&1; then
    tail -n 30 "$build_tmp/debootstrap.log" >&2
    tail -n 30 "$root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    die "debootstrap failed"
  fi
  unmount_under "$root"
  log "debootstrap done after $(secs_since "$t0") s"
  configure_rootfs "$root"
  # The guest boots its own kernel; qemu loads it (and the initrd) from next to the image.
  cp "$(newest "$root"/boot/vmlinuz-*)" "$build_tmp/vmlinuz"
  cp "$(newest "$root"/boot/initrd.img-*)" "$build_tmp/initrd.img"
  # -d fills the file system from the directory: no loop device or mount on the host. The file
  # is sparse: 8G of room for the guest, only what is written takes disk space.
  truncate -s "$DISK_SIZE" "$build_tmp/rootfs.img"
  log "rootfs configured after $(secs_since "$t0") s"
  mkfs.ext4 -q -F -L gantry-node -d "$root" "$build_tmp/rootfs.img" >/dev/null
  rm -rf --one-file-system "$root" "$build_tmp/debootstrap.log"
  # Atomic: the key's folder exists only complete.
  chmod 755 "$build_tmp"
  mv -T "$build_tmp" "$dir"
  build_tmp=
  log "built $dir in $(secs_since "$t0") s"
}

# ---------------------------------------------------------------------------------------------
# run

run_tmp=
qemu_pid=
tail_pid=
cleanup_run() {
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait_gone "$qemu_pid" 50 || kill -9 "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  if [ -n "$tail_pid" ]; then kill "$tail_pid" 2>/dev/null || true; wait "$tail_pid" 2>/dev/null || true; fi
  if [ -n "$run_tmp" ]; then
    if [ -f "$run_tmp/serial.log" ]; then cp "$run_tmp/serial.log" "$CACHE/last-serial.log" 2>/dev/null || true; fi
    rm -rf --one-file-system "$run_tmp"
  fi
}

# wait_gone PID TENTHS: waits up to TENTHS/10 s for PID to exit.
wait_gone() {
  local i
  for ((i = 0; i < $2; i++)); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

pick_accel() {
  case ${GANTRY_NODE_ACCEL:-} in
    kvm|tcg) echo "$GANTRY_NODE_ACCEL"; return ;;
    '') ;;
    *) die "GANTRY_NODE_ACCEL must be kvm or tcg" 2 ;;
  esac
  if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then echo kvm; else echo tcg; fi
}

serial_tail() {
  log "last lines of the serial log ($CACHE/last-serial.log after exit):"
  tail -n 40 "$run_tmp/serial.log" >&2 2>/dev/null || true
}

# share_path DIR: the canonical absolute path, refused when the guest could not mount it there.
share_path() {
  local p
  p=$(cd "$1" 2>/dev/null && pwd -P) || die "--share $1: not a directory" 2
  [ "$p" != / ] || die "--share /: refusing to cover the guest's root" 2
  case $p in *$'\n'*|*' '*) die "--share $1: spaces or newlines in the path" 2 ;; esac
  echo "$p"
}

cmd_run() {
  local timeout=1800 shares=() checkout script_dir
  while [ $# -gt 0 ]; do
    case $1 in
      --timeout) [ $# -ge 2 ] || usage; timeout=$2; shift 2 ;;
      --timeout=*) timeout=${1#*=}; shift ;;
      --share) [ $# -ge 2 ] || usage; shares+=("$(share_path "$2")"); shift 2 ;;
      --share=*) shares+=("$(share_path "${1#*=}")"); shift ;;
      --) shift; break ;;
      -*) usage ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || usage
  if ! [[ $timeout =~ ^[0-9]+$ ]] || [ "$timeout" -eq 0 ]; then die "--timeout wants a positive number of seconds" 2; fi
  local cmd
  if [ $# -eq 1 ]; then cmd=$1; else cmd=$(printf '%q ' "$@"); fi

  script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
  checkout=$(git -C "$script_dir" rev-parse --show-toplevel 2>/dev/null || (cd "$script_dir/.." && pwd -P))
  checkout=$(share_path "$checkout")

  # A cached image skips the build, not the tools the run itself needs (qemu-img, qemu).
  ensure_host_tools
  ensure_image
  local dir accel cpus mem t0
  dir=$(image_dir)
  accel=$(pick_accel)
  cpus=${GANTRY_NODE_CPUS:-$(nproc)}
  mem=${GANTRY_NODE_MEM_MB:-4096}

  run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/gantry-node.XXXXXX")
  local res=$run_tmp/results
  mkdir -p "$res"
  # Copy-on-write on top of the cached image, thrown away with run_tmp.
  qemu-img create -q -f qcow2 -b "$dir/rootfs.img" -F raw "$run_tmp/overlay.qcow2"
  printf '%s\n' "$cmd" >"$res/cmd"
  printf '%s\n' "$checkout" >"$res/cwd"
  printf '%s\n' "${GANTRY_NODE_9P_CACHE:-mmap}" >"$res/cache"

  local qemu=(qemu-system-x86_64 -nodefaults -no-user-config -no-reboot
    -machine "q35,sata=off,smbus=off,vmport=off" -smp "$cpus" -m "$mem"
    -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img"
    -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 apparmor=1 security=apparmor panic=1"
    -drive "file=$run_tmp/overlay.qcow2,if=virtio,format=qcow2,cache=unsafe"
    -device virtio-rng-pci -nic none
    -display none -monitor none -serial "file:$run_tmp/serial.log")
  if [ "$accel" = kvm ]; then qemu+=(-accel kvm -cpu host); else qemu+=(-accel "tcg,thread=multi" -cpu max); fi
  # The results share first (tag gantry-results), then the checkout and --share dirs, each at
  # its own path. passthrough: guest root's files are root's on the host, modes kept.
  # multidevs=remap: a share spanning host file systems keeps inode numbers unique.
  local i=0 p all=("$checkout")
  local -A seen=()
  [ ${#shares[@]} -gt 0 ] && all+=("${shares[@]}")
  qemu+=(-fsdev "local,id=fsres,path=$res,security_model=passthrough,multidevs=remap"
         -device "virtio-9p-pci,fsdev=fsres,mount_tag=$RESULTS_TAG")
  : >"$res/shares"
  for p in "${all[@]}"; do
    [ -z "${seen[$p]:-}" ] || continue
    seen[$p]=1
    qemu+=(-fsdev "local,id=fs$i,path=$p,security_model=passthrough,multidevs=remap"
           -device "virtio-9p-pci,fsdev=fs$i,mount_tag=share$i")
    printf 'share%d %s\n' "$i" "$p" >>"$res/shares"
    i=$((i + 1))
  done

  log "accel=$accel cpus=$cpus mem=${mem}M image=$dir"
  log "shares: $(cut -d' ' -f2 "$res/shares" | paste -sd' ')"
  t0=$(now_ms)
  "${qemu[@]}" 2>"$run_tmp/qemu.err" &
  qemu_pid=$!
  local started='' timed_out='' deadline=$((t0 + timeout * 1000))
  while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ -z "$started" ] && [ -e "$res/started" ]; then
      started=1
      log "guest script started after $(secs_since "$t0") s"
      # --pid: tail stops (after a last read) once qemu is gone.
      tail -n +1 -s 0.2 -f --pid="$qemu_pid" "$res/output" &
      tail_pid=$!
    fi
    if [ "$(now_ms)" -ge "$deadline" ]; then timed_out=1; break; fi
    sleep 0.2
  done
  if [ -n "$timed_out" ]; then
    kill "$qemu_pid" 2>/dev/null || true
    wait_gone "$qemu_pid" 50 || kill -9 "$qemu_pid" 2>/dev/null || true
  fi
  local qrc=0
  wait "$qemu_pid" 2>/dev/null || qrc=$?
  qemu_pid=
  if [ -n "$tail_pid" ]; then
    wait "$tail_pid" 2>/dev/null || true
    tail_pid=
  elif [ -f "$res/output" ]; then
    # The command ended between two polls: show its output all the same.
    [ -e "$res/started" ] && log "guest script started (seen after qemu exited)"
    cat "$res/output"
  fi
  if [ -n "$timed_out" ]; then
    log "timeout after ${timeout} s: qemu killed"
    serial_tail
    log "done in $(secs_since "$t0") s"
    exit 124
  fi
  if [ ! -f "$res/rc" ]; then
    log "the VM stopped (qemu status $qrc) before the command reported an exit status"
    [ -s "$run_tmp/qemu.err" ] && cat "$run_tmp/qemu.err" >&2
    serial_tail
    log "done in $(secs_since "$t0") s"
    exit 125
  fi
  local rc
  rc=$(cat "$res/rc")
  log "done in $(secs_since "$t0") s (exit status $rc)"
  exit "$rc"
}

# ---------------------------------------------------------------------------------------------

# A second Ctrl-C during the cleanup must not cut it short (and leave qemu or files behind).
on_exit() { trap '' INT TERM; cleanup_run; cleanup_build; }
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

case ${1:-} in
  build) shift; [ $# -eq 0 ] || usage; t=$(now_ms); ensure_image; log "done in $(secs_since "$t") s" ;;
  run) shift; cmd_run "$@" ;;
  clean)
    shift; [ $# -eq 0 ] || usage
    if [ -d "$CACHE" ]; then
      lock_cache
      unmount_under "$CACHE"
      rm -rf --one-file-system "$CACHE"
      log "removed $CACHE"
    fi
    ;;
  *) usage ;;
esac
