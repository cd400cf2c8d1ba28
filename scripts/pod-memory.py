#!/usr/bin/env python3
"""Per-pod memory of the processes that serve running pods, one row per handler.

    pod-memory.py --pods N --containers K NAME=EXECUTABLE [NAME=EXECUTABLE ...]

Every process whose /proc/PID/exe is EXECUTABLE counts for NAME (gantry's daemons; CRI-O's
conmons); its smaps_rollup PSS, RSS and anonymous memory and its thread count are summed and
divided by N, the pods that handler runs. Called by scripts/bench-crio.sh with every pod up.
The ratio column is each handler against the last one named.
"""
import argparse
import os


def processes(exe):
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if os.path.realpath(f'/proc/{pid}/exe') == exe:
                yield pid
        except OSError:
            continue


def usage(pid):
    kb = {}
    with open(f'/proc/{pid}/smaps_rollup') as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == 'kB':
                kb[parts[0].rstrip(':')] = int(parts[1])
    kb['Threads'] = len(os.listdir(f'/proc/{pid}/task'))
    return kb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--pods', type=int, required=True)
    ap.add_argument('--containers', type=int, required=True)
    ap.add_argument('handlers', nargs='+', metavar='NAME=EXECUTABLE')
    a = ap.parse_args()
    rows = []
    for h in a.handlers:
        name, exe = h.split('=', 1)
        procs = []
        for pid in processes(os.path.realpath(exe)):
            try:
                procs.append(usage(pid))
            except OSError:
                continue
        total = {k: sum(p.get(k, 0) for p in procs) for k in ('Pss', 'Rss', 'Anonymous', 'Threads')}
        rows.append((name, len(procs), {k: v / a.pods for k, v in total.items()}))
    base = rows[-1][2]['Pss'] or 1
    print(f"\nper pod, {a.pods} pods per handler with {a.containers} app container(s) each, all running")
    print(f"{'handler':<14}{'processes':>10}{'PSS kB':>9}{'RSS kB':>9}{'anon kB':>9}{'threads':>9}{'PSS ratio':>11}")
    for name, n, per in rows:
        print(f"{name:<14}{n:>10}{per['Pss']:>9.0f}{per['Rss']:>9.0f}{per['Anonymous']:>9.0f}"
              f"{per['Threads']:>9.1f}{per['Pss'] / base:>10.2f}x")


if __name__ == '__main__':
    main()
