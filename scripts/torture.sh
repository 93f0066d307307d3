#!/usr/bin/env bash
# The torture harness: per backend, several worker processes take one lock and do a fenced
# read-modify-write on a checker store while a nemesis pauses (SIGSTOP) and kills holders, kills
# waiters, stalls and cuts their connections, restarts servers and kills ensemble leaders; workers
# also give up timed attempts, one of them takes the lock again at once for part of the run, and
# on Redis a foreign SET NX client contends. It checks safety (stale writes, unannounced
# overlaps) and liveness (the lock unavailable longer than the faults explain). See
# docs/SAFETY.md for what is measured and how to read the report.
#
#   scripts/torture.sh [--backends LIST] [--duration DUR] [--report FILE] [--quick]
#                      [--workers N] [--lease DUR] [--logs DIR] [--lock mutex|rw|semaphore|election]
#                      [--parallel N] [--max-unavailable DUR]
#
#   --backends LIST  comma-separated, of sqlite,redis,redis-sentinel,redis-cluster,redlock,
#                    postgres,mysql,zookeeper,etcd (default all)
#   --duration DUR   nemesis time per backend (default 60s; 17s with --quick), e.g. 30s, 10m
#   --report FILE    also write the JSON report (one object per backend) to FILE
#   --quick          every backend, each fault kind at least once, about 3 minutes in all
#   --workers N      worker processes per backend (default 4)
#   --lease DUR      lease of every hold (default 1500ms; worker 1 asks for five times that)
#   --logs DIR       where the workers' stderr and the timelines go (default a new directory
#                    under /tmp)
#   --lock KIND      what the workers take: mutex (default); rw, the key's read-write lock
#                    (even workers write, odd ones read: a writer beside anyone is an overlap);
#                    semaphore, one of workers/2 permits (more holders at once is an
#                    over-admission); election, a candidacy in the key's election (leaders
#                    write with their term; two leaders at once is an overlap)
#   --parallel N     run up to N backends at once (default 1): a 10-minute run of all nine
#                    backends takes about 35 minutes with --parallel 3
#   --max-unavailable DUR
#                    fail a backend whose max_unexplained_unavailable_ms is above DUR
#                    (default 3s with --quick, not judged otherwise)
#
# Exit status: 0 when no backend shows a stale write accepted (on fenced backends), an
# unannounced overlap, an over-admission, a fence regression or a lost update, every fault kind a
# backend supports was injected, the foreign client was served and the lock was never
# unavailable longer than allowed; 1 otherwise; 2 for usage errors. The servers come from
# distlock's testkit (scripts/test.sh installs them).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

for arg in "$@"; do
    case "$arg" in
        -h | --help)
            awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
            exit 0
            ;;
    esac
done

# Built with the workspace's features unified, as the tests build it, so that a run right after
# the tests reuses their build of distlock instead of compiling it again with fewer features.
cargo build --quiet --workspace --all-features --bin distlock-torture
exec "${CARGO_TARGET_DIR:-target}/debug/distlock-torture" "$@"
