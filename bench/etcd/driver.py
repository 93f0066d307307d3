#!/usr/bin/env python3
"""distlock's etcd backend measured by the method of the other-backends harness ($DISTLOCK_OTHER_BACKENDS_HARNESS) (read-only,
imported, not changed), in the same run as its baselines and its etcd recipes, against one
throwaway etcd started by the harness's servers.py (same flags: fsync on, default snapshots).

  baseline  range and put of one key through the harness's client (JSON gateway, http.client)
            and through distlock's own gRPC client (tonic, crates/distlock-bench, etcd_bench_worker)
  S1        one client, one key: acquire + release back to back (distlock; the harness's v3lock
            RPC and concurrency.Mutex recipe)
  S2        4 processes, one key, blocking acquire, non-atomic counter-file increment, release
            (distlock; the harness's Go-style Mutex recipe, its watch-now+recheck variant, v3lock)
The statistics are the harness's own (bench.analyse_cycles). Run through bench/etcd/run.sh.
"""
import argparse
import datetime
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.environ.get("DISTLOCK_OTHER_BACKENDS_HARNESS",
                         os.path.join(os.path.dirname(ROOT), "shared", "bench", "other-backends"))
sys.path.insert(0, HARNESS)
import bench  # noqa: E402
import servers  # noqa: E402

# Where run.sh's `cargo build` put it: $CARGO_TARGET_DIR if set, as for cargo.
WORKER = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "etcd_bench_worker")

PY_S1 = [("v3lock", ""), ("mutex", "")]
PY_S2 = [("mutex", ""), ("mutex", "watch-now+recheck"), ("v3lock", "")]


class Runner(bench.Runner):
    """The harness's runner; `rust` switches the worker to distlock's example binary."""
    rust = False

    def launch(self, args):
        import subprocess  # noqa: PLC0415
        argv = [WORKER, *args] if self.rust else [bench.PY, os.path.join(HARNESS, "worker.py"), *args]
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=servers.pin_fn(self.client_cpus), cwd=HARNESS)


def measure(opts, runner, server, log):
    rows = []

    def baseline(rust, op):
        runner.rust = rust
        r = runner.run("etcd", server, "baseline", 1, opts.baseline_s, ["--op", op])
        row = {"kind": "baseline", "client": "distlock" if rust else "harness", "op": op,
               "loadavg1": r["loadavg1"], "cpu": r["cpu"]}
        if r["failed"] or not r["results"]:
            row["failed"] = r["failed"]
        else:
            res = r["results"][0]
            win = (res["finished_ns"] - res["start_ns"]) / 1e9
            row.update({"ops_per_s": len(res["lat_ns"]) / win, "latency": bench.dist(res["lat_ns"]),
                        "client_lib": r["ready"][0].get("client")})
        rows.append(row)
        log(f"  baseline {row['client']} {op}: " + (f"p50 {row['latency']['p50_us']:.1f} us" if "latency" in row
                                                    else f"FAILED {row.get('failed')}"))

    def cycles(rust, scen, recipe, variant):
        runner.rust = rust
        nprocs = 1 if scen == "S1" else opts.procs
        dur = opts.s1_s if scen == "S1" else opts.s2_s
        key = f"k-{scen}-{recipe}-{variant or 'default'}-{os.getpid()}"
        extra = ["--recipe", recipe, "--variant", variant, "--key", key, "--warmup", str(opts.warmup)]
        counter_file = None
        if scen == "S2":
            counter_file = os.path.join(runner.scratch, f"counter-etcd-{recipe}-{variant or 'default'}")
            with open(counter_file, "w") as f:
                f.write("0")
            extra += ["--counter-file", counter_file]
        r = runner.run("etcd", server, scen, nprocs, dur, extra)
        row = {"kind": scen, "recipe": recipe, "variant": variant, "procs": nprocs, "loadavg1": r["loadavg1"],
               "cpu": r["cpu"]}
        if r["failed"] or len(r["results"]) != nprocs:
            row["failed"] = r["failed"] or "missing results"
        if r["results"]:
            counter = None
            if counter_file:
                with open(counter_file) as f:
                    counter = int(f.read().strip() or 0)
            start = min(x["start_ns"] for x in r["results"])
            row.update(bench.analyse_cycles([(x["proc_id"], x) for x in r["results"]], start, counter, scen))
        rows.append(row)
        log("  " + short(row))

    # the server itself warms up first (discarded)
    runner.rust = False
    runner.run("etcd", server, "baseline", 1, 1.0, ["--op", "write"])
    for rust in (False, True):
        for op in ("read", "write"):
            baseline(rust, op)
    for recipe, variant in PY_S1:
        cycles(False, "S1", recipe, variant)
    cycles(True, "S1", "distlock", "")
    cycles(True, "S2", "distlock", "")
    for recipe, variant in PY_S2:
        cycles(False, "S2", recipe, variant)
    return rows


def short(r):
    name = r["recipe"] + (f"/{r['variant']}" if r["variant"] else "")
    if r.get("failed") and "cycle_latency" not in r:
        return f"{r['kind']} {name}: FAILED {r['failed'][-300:]}"
    s = f"{r['kind']} {name}: {r['cycles_per_s']:.0f}/s, cycle p50 {r['cycle_latency']['p50_us']:.1f} us"
    if r["kind"] == "S2":
        s += (f", handoff p50 {r['handoff']['p50_us'] or 0:.0f} p99 {r['handoff']['p99_us'] or 0:.0f} us, share "
              f"{r.get('share_min', 0):.0%}-{r.get('share_max', 0):.0%}, lost {r['lost_updates']}, "
              f"overlaps {r['overlapping_holds']}, errors {r['errors']}")
    return s


def f1(x):
    return "–" if x is None else (f"{x:,.0f}" if x >= 1000 else f"{x:.1f}")


def table(server, rows):
    base = {(r["client"], r["op"]): r for r in rows if r["kind"] == "baseline" and "latency" in r}
    w_h = base.get(("harness", "write"), {}).get("latency", {}).get("p50_us")
    w_d = base.get(("distlock", "write"), {}).get("latency", {}).get("p50_us")
    out = [f"### etcd {server.version}", "",
           "| baseline (1 client) | client | ops/s | p50 µs | p99 µs | load avg |", "|---|---|---|---|---|---|"]
    for (client, op), r in sorted(base.items()):
        out.append(f"| {op} | {r['client_lib']} | {r['ops_per_s']:,.0f} | {f1(r['latency']['p50_us'])} | "
                   f"{f1(r['latency']['p99_us'])} | {r['loadavg1']:.2f} |")
    out += ["", "| S1 (1 client, 1 key) | cycles/s | p50 µs | p99 µs | ÷ put p50 (harness client) | "
                "÷ put p50 (distlock's client) | acquire / release p50 µs | errors | load avg |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] != "S1" or "cycle_latency" not in r:
            continue
        p50 = r["cycle_latency"]["p50_us"]
        ratio_h = f"{p50 / w_h:.2f}×" if w_h else "–"
        ratio_d = f"{p50 / w_d:.2f}×" if w_d else "–"
        out.append(f"| {r['recipe']}{'/' + r['variant'] if r['variant'] else ''} | {r['cycles_per_s']:,.0f} | "
                   f"{f1(p50)} | {f1(r['cycle_latency']['p99_us'])} | {ratio_h} | {ratio_d} | "
                   f"{f1(r['acquire_latency']['p50_us'])} / {f1(r['release_latency']['p50_us'])} | "
                   f"{r['errors']} | {r['loadavg1']:.2f} |")
    go = next((r for r in rows if r["kind"] == "S2" and r["recipe"] == "mutex" and not r["variant"]
               and "cycles_per_s" in r), None)
    out += ["", "| S2 (4 processes, 1 key) | cycles/s | × Go-style Mutex | handoff p50 / p99 µs | "
                "cross-holder p50 / p99 µs | switch | share min–max | lost updates | overlaps | errors | load avg |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] != "S2" or "cycle_latency" not in r:
            continue
        h, c = r["handoff"], r["handoff_cross_holder"]
        times = f"{r['cycles_per_s'] / go['cycles_per_s']:.1f}×" if go and go["cycles_per_s"] else "–"
        out.append(f"| {r['recipe']}{'/' + r['variant'] if r['variant'] else ''} | {r['cycles_per_s']:,.0f} | "
                   f"{times} | {f1(h['p50_us'])} / {f1(h['p99_us'])} | {f1(c['p50_us'])} / {f1(c['p99_us'])} | "
                   f"{r['holder_switch_ratio']:.0%} | {r.get('share_min', 0):.1%}–{r.get('share_max', 0):.1%} | "
                   f"{r['lost_updates']} | {r['overlapping_holds']} | {r['errors']} | {r['loadavg1']:.2f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pin", choices=["same", "split", "none"], default="same")
    ap.add_argument("--baseline-s", type=float, default=5.0)
    ap.add_argument("--s1-s", type=float, default=5.0)
    ap.add_argument("--s2-s", type=float, default=6.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--startup-timeout-s", type=float, default=30.0)
    ap.add_argument("--grace-s", type=float, default=15.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench-etcd"))
    opts = ap.parse_args()
    run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    scratch = os.path.join(opts.out, "scratch", run_id)
    os.makedirs(scratch, exist_ok=True)
    server_cpus, client_cpus = bench.placement(opts.pin)
    runner = Runner(opts, scratch, client_cpus)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    load0 = os.getloadavg()
    log("== etcd")
    srv = servers.SERVERS["etcd"](scratch, server_cpus)
    try:
        srv.start()
        log(f"  server {srv.version} on 127.0.0.1:{srv.port}")
        import recipes  # noqa: PLC0415
        setup = recipes.BACKENDS["etcd"](srv.conn_params())
        setup.setup()
        setup.close()
        rows = measure(opts, runner, srv, log)
        text_table = table(srv, rows)
    finally:
        srv.stop()
        srv.cleanup()
    shutil.rmtree(scratch, ignore_errors=True)
    head = (f"# Run {run_id} (pin {opts.pin}; load average at start "
            f"{load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}, at end "
            + " / ".join(f"{x:.2f}" for x in os.getloadavg()) + ")")
    text = head + "\n\n" + text_table + "\n"
    os.makedirs(os.path.join(opts.out, run_id), exist_ok=True)
    with open(os.path.join(opts.out, run_id, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(opts.out, run_id, "summary.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(text)
    print(f"results: {os.path.join(opts.out, run_id)}")
    return 1 if any(r.get("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
