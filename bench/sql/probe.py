#!/usr/bin/env python3
"""Where a distlock S2 hand-over spends its time, from the timelines the workers write when
DISTLOCK_BENCH_PROBE names a directory (crates/distlock-bench/src/probe.rs):

  DISTLOCK_BENCH_PROBE=/tmp/p bench/sql/run.sh --backends pg --s2-s 4
  bench/sql/probe.py /tmp/p            # the cross-holder gaps and how their waits ended
  bench/sql/probe.py /tmp/p --show 5   # also the merged timelines of the 5 slowest

Each file holds one process's events ([CLOCK_MONOTONIC ns, name]): the worker's own
`acquired` / `release` / `released` instants and the library's `distlock::probe` trace events
(`attempt`, `busy`, `got`, `yield`, `yield_woken`, `yield_timeout`, `woken`, `poll`; PostgreSQL
`pg_own` / `pg_table` notifications, `take_place`, `peek`, `recheck_free`; MariaDB `my_*`
doorbell steps). The last run's files win (S2 runs after S1)."""
import argparse
import bisect
import collections
import json
import os


def load(d):
    ev = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".jsonl"):
            pid = f.split(".")[0]
            with open(os.path.join(d, f)) as fh:
                ev += [(t, pid, e) for t, e in map(json.loads, fh)]
    ev.sort()
    return ev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--slow", type=float, default=0.98, help="quantile from which a gap is slow")
    o = ap.parse_args()
    ev = load(o.dir)
    times = [x[0] for x in ev]
    cycles, acq = [], {}
    for t, p, e in ev:
        if e == "acquired":
            acq[p] = t
        elif e == "release" and p in acq:
            cycles.append((acq.pop(p), t, p))
    cycles.sort()
    cross = [(c[0] - b[1], b, c) for b, c in zip(cycles, cycles[1:]) if b[2] != c[2]]
    gaps = sorted(g for g, _, _ in cross)
    q = lambda x: gaps[min(len(gaps) - 1, int(x * len(gaps)))] / 1000
    print(f"cross-holder gaps: {len(gaps)}, p50 {q(.5):.0f} us, p90 {q(.9):.0f}, p99 {q(.99):.0f}, "
          f"max {gaps[-1] / 1000:.0f}")

    def window(a, b):
        return ev[bisect.bisect_left(times, a):bisect.bisect_right(times, b)]

    thr = q(o.slow) * 1000
    ends = collections.Counter()
    for gap, prev, cur in cross:
        if gap < thr:
            continue
        mine = [e for _, p, e in window(prev[1], cur[0]) if p == cur[2]]
        how = [e for e in mine if e in ("yield_timeout", "yield_woken", "woken", "poll")]
        ends[how[-1] if how else "no wait"] += 1
    print(f"gaps >= {thr / 1000:.0f} us, by how the next holder's last wait ended:", dict(ends))
    for gap, prev, cur in sorted(cross, reverse=True)[:o.show]:
        print(f"--- {gap / 1000:.0f} us, {prev[2]} -> {cur[2]} (H holder, N next)")
        for t, p, e in window(prev[1], cur[0]):
            role = "H" if p == prev[2] else "N" if p == cur[2] else "-"
            print(f"  {(t - prev[1]) / 1000:9.0f} {role}{p} {e}")


if __name__ == "__main__":
    main()
