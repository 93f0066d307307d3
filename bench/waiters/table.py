#!/usr/bin/env python3
"""Markdown table of bench/waiters/run.sh's and peers/run.sh's JSON lines: table.py FILE.jsonl...

A peer's line (it has a `client` field) shows as `backend: client`."""
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


if __name__ == "__main__":
    main(sys.argv[1:])
