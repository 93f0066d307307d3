#!/usr/bin/env python3
"""Markdown table of bench/waiters/run.sh's and peers/run.sh's JSON lines: table.py FILE.jsonl...

A peer's line (it has a `client` field) shows as `backend: client`.
table.py --growth FILE.jsonl...: for each backend (and client), p50 and server CPU per hand-over
at the smallest and the largest W measured, and their ratio (issue 29's target: at most 1.5)."""
import json
import sys


def fmt(v, digits=0):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def main(paths):
    print("| backend | layout | W | hand-overs (s) | p50 µs | p99 µs | server CPU µs | "
          "client CPU µs | wake-ups | attempts | max_poll | load |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for path in paths:
        for line in open(path):
            d = json.loads(line)
            name = f"{d['backend']}: {d['client']}" if "client" in d else d.get("backend")
            if "error" in d:
                print(f"| {name} | | {fmt(d.get('waiters'))} | failed: {d['error']} "
                      "| | | | | | | | |")
                continue
            note = "" if d["errors"] == 0 else f" ({d['errors']} errors)"
            print(
                f"| {name} | {d['layout']} | {fmt(d['waiters'])} "
                f"| {fmt(d['handoffs'])} ({d['seconds']}){note} "
                f"| {fmt(d['handoff_p50_us'])} | {fmt(d['handoff_p99_us'])} "
                f"| {fmt(d['server_cpu_us_per_handoff'])} | {fmt(d['client_cpu_us_per_handoff'])} "
                f"| {fmt(d['wakeups_per_handoff'], 2)} | {fmt(d['attempts_per_handoff'], 2)} "
                f"| {'default' if d['max_poll_s'] is None else str(d['max_poll_s']) + ' s'} "
                f"| {d['loadavg'].split()[0]} |")


def growth(paths):
    runs = {}
    for path in paths:
        for line in open(path):
            d = json.loads(line)
            if "error" in d or not d.get("handoffs"):
                continue
            name = f"{d['backend']}: {d['client']}" if "client" in d else d["backend"]
            runs.setdefault(name, {})[d["waiters"]] = d
    print("| backend | W | p50 µs | × | server CPU µs | × | attempts |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, by_w in runs.items():
        lo, hi = by_w[min(by_w)], by_w[max(by_w)]

        def ratio(k):
            a, b = lo[k], hi[k]
            return "–" if a is None or b is None or a == 0 else f"{b / a:.2f}"
        print(f"| {name} | {fmt(lo['waiters'])} → {fmt(hi['waiters'])} "
              f"| {fmt(lo['handoff_p50_us'])} → {fmt(hi['handoff_p50_us'])} | {ratio('handoff_p50_us')} "
              f"| {fmt(lo['server_cpu_us_per_handoff'])} → {fmt(hi['server_cpu_us_per_handoff'])} "
              f"| {ratio('server_cpu_us_per_handoff')} "
              f"| {fmt(lo['attempts_per_handoff'], 2)} → {fmt(hi['attempts_per_handoff'], 2)} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--growth"]:
        growth(sys.argv[2:])
    else:
        main(sys.argv[1:])
