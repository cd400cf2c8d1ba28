#!/usr/bin/env bash
# Seccomp notify's per-call cost and the cost of recording a profile, through a running private
# containerd with gantry registered (scripts/bench.sh calls it with its own):
#
#   scripts/bench-seccomp.sh SOCKET NAMESPACE WORKDIR GANTRY_TOML IMAGE [RUNS]
#
#   - one watched call's round trip: a busybox loop of N `cd /` (one chdir each) timed inside the
#     container (/proc/uptime), chdir watched with `log` (the daemon answers CONTINUE, as a
#     recording does) against the same profile without the watch; (watched - plain) / N;
#   - recording: the recording workload of integration/seccomp_record.rs (sh, ls, cat, date,
#     sleep, wget from busybox nc on 127.0.0.1) timed inside the container, recorded against
#     plain, and `ctr run --rm` wall time of each; runs interleaved, medians; and how many
#     syscalls the recorded profile allows.
# Prints its lines; targets are reported, never enforced.
set -euo pipefail
sock=$1 ns=$2 work=$3 base=$4 image=$5 runs=${6:-5}
loop=${GANTRY_BENCH_CHDIRS:-20000}
ctr_() { ctr --address "$sock" -n "$ns" "$@"; }
mkdir -p "$work/seccomp-bench"
w=$work/seccomp-bench
profiles=$w/profiles
{ cat "$base"; printf '[security]\nseccomp_default = "runtime-default"\n'; } >"$w/plain.toml"
{ cat "$w/plain.toml"; printf 'seccomp_notify = ["chdir"]\nseccomp_notify_action = "log"\n'; } >"$w/watch.toml"
{ cat "$base"; printf '[security]\nseccomp_recording_dir = "%s"\n' "$profiles"; } >"$w/record.toml"
port=$((20000 + $$ % 20000))
workload="ls / >/dev/null; cat /etc/passwd /etc/group >/dev/null; date >/dev/null; sleep 0.1; \
printf 'HTTP/1.0 200 OK\\r\\nContent-Length: 65536\\r\\n\\r\\n' >/tmp/resp; dd if=/dev/zero bs=64k count=1 2>/dev/null >>/tmp/resp; \
nc -l -p $port </tmp/resp >/dev/null & \
until grep -qE \":\$(printf %04X $port) [0:]+ 0A\" /proc/net/tcp /proc/net/tcp6; do sleep 0.05; done; \
wget -q -O /dev/null http://127.0.0.1:$port/big; while kill -0 \$! 2>/dev/null; do sleep 0.05; done"
# Prints the seconds (10 ms resolution) SCRIPT took inside the container, then ctr's wall ms.
timed() {
  local cfg=$1 id=$2 script=$3
  shift 3
  local t0=$EPOCHREALTIME out
  out=$(ctr_ run --rm --net-host --runtime io.containerd.gantry.v2 --runtime-config-path "$cfg" "$@" \
    "$image" "$id" sh -c "s=\$(cut -d' ' -f1 /proc/uptime); $script; e=\$(cut -d' ' -f1 /proc/uptime); echo T \$s \$e")
  awk -v o="$out" -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { n = split(o, l, "\n"); split(l[n], f, " ")
    printf "%.3f %.3f\n", f[3] - f[2], (b - a) * 1000 }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.3f", v[int((NR + 1) / 2)] }'; }
chdirs="i=0; while [ \$i -lt $loop ]; do cd /; i=\$((i+1)); done"
: >"$w/plain" && : >"$w/watch" && : >"$w/rec" && : >"$w/norec"
for r in $(seq "$runs"); do
  timed "$w/plain.toml" "sb-plain-$r" "$chdirs" >>"$w/plain"
  timed "$w/watch.toml" "sb-watch-$r" "$chdirs" >>"$w/watch"
  timed "$base" "sb-norec-$r" "$workload" >>"$w/norec"
  timed "$w/record.toml" "sb-rec-$r" "$workload" --annotation "gantry.dev/seccomp-record=bench-$r" >>"$w/rec"
done
p=$(cut -d' ' -f1 "$w/plain" | median) q=$(cut -d' ' -f1 "$w/watch" | median)
awk -v p="$p" -v q="$q" -v n="$loop" 'BEGIN {
  printf "seccomp notify: one watched call (chdir, log) %.1f us round trip (%d calls: %.2f s watched, %.2f s not)\n",
    (q - p) / n * 1e6, n, q, p }'
a=$(cut -d' ' -f1 "$w/norec" | median) b=$(cut -d' ' -f1 "$w/rec" | median)
wa=$(cut -d' ' -f2 "$w/norec" | median) wb=$(cut -d' ' -f2 "$w/rec" | median)
allowed=$(python3 -c 'import json, sys; print(sum(len(r["names"]) for r in json.load(open(sys.argv[1]))["syscalls"]))' "$profiles/bench-1.json")
awk -v a="$a" -v b="$b" -v wa="$wa" -v wb="$wb" -v n="$allowed" 'BEGIN {
  printf "seccomp recording: busybox workload %.2f s recorded against %.2f s plain (%+.2f s), ctr run --rm %.0f ms against %.0f ms (%+.0f ms); profile allows %d syscalls\n",
    b, a, b - a, wb, wa, wb - wa, n }'
