#!/usr/bin/env python3
"""Per-thread CPU use of running processes, sampled from /proc, for finding which thread limits
a benchmark (NCCL's proxy thread, Accord's workers, the user thread).

Usage: thread_cpu.py PATTERN [--interval S] [--samples N] [--top K] [--wait S]
  Waits (up to --wait seconds) for processes whose command line contains PATTERN, then prints,
  for each interval, the K busiest threads as `pid tid name cpu%` (100% = one core), and the
  busiest interval's summary grouped by thread name. Stops after N intervals or when every
  matched process is gone. Linux only; reads /proc/<pid>/task/<tid>/stat (utime + stime).
"""

import argparse
import os
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def matching_pids(pattern):
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern in cmd and "thread_cpu.py" not in cmd:
            pids.append(int(entry))
    return pids


def thread_times(pids):
    """{(pid, tid): (name, cpu seconds)} for every thread of the given processes."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # The name is in parentheses and may hold spaces; the fields after it are fixed.
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            utime, stime = int(fields[11]), int(fields[12])
            out[(pid, int(tid))] = (name, (utime + stime) / TICKS)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pattern")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--top", type=int, default=16)
    p.add_argument("--wait", type=float, default=60.0)
    args = p.parse_args()
    deadline = time.monotonic() + args.wait
    pids = matching_pids(args.pattern)
    while not pids and time.monotonic() < deadline:
        time.sleep(0.2)
        pids = matching_pids(args.pattern)
    if not pids:
        print(f"no process matches {args.pattern!r}", file=sys.stderr)
        return 1
    before, t0 = thread_times(pids), time.monotonic()
    busiest = (0.0, None)
    for n in range(args.samples):
        time.sleep(args.interval)
        pids = matching_pids(args.pattern) or pids
        after, t1 = thread_times(pids), time.monotonic()
        if not after:
            break
        rows = []
        for key, (name, secs) in after.items():
            prev = before.get(key, (name, secs))[1]
            rows.append((100.0 * (secs - prev) / (t1 - t0), key, name))
        rows.sort(reverse=True)
        total = sum(r[0] for r in rows)
        print(f"interval {n} ({t1 - t0:.1f} s): total {total:.0f}% over {len(rows)} threads")
        for cpu, (pid, tid), name in rows[:args.top]:
            print(f"  {pid:>7} {tid:>7} {name:<16} {cpu:6.1f}%")
        if total > busiest[0]:
            busiest = (total, rows)
        before, t0 = after, t1
        if not matching_pids(args.pattern):
            break
    if busiest[1]:
        groups = {}
        for cpu, _, name in busiest[1]:
            count, sum_cpu = groups.get(name, (0, 0.0))
            groups[name] = (count + 1, sum_cpu + cpu)
        print(f"busiest interval by thread name (total {busiest[0]:.0f}%):")
        for name, (count, cpu) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
            if cpu >= 1.0:
                print(f"  {name:<16} threads {count:>3}  cpu {cpu:7.1f}%  per thread {cpu / count:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
