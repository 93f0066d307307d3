#!/usr/bin/env python3
"""Renders the JSON lines of bench/scale/run.sh as a Markdown table: table.py RESULTS.jsonl [OUT.md]."""
import json
import sys

COLUMNS = [
    ("backend", "backend"),
    ("idle_handles", "idle handles"),
    ("idle_bytes_per_handle", "B/idle handle"),
    ("held_locks", "held locks"),
    ("acquire_per_s", "acquire/s"),
    ("held_bytes_per_lock", "B/held lock"),
    ("hold_s", "hold s"),
    ("client_renewal_cpu_pct", "client CPU %"),
    ("server_renewal_cpu_pct", "server CPU %"),
    ("lost_during_hold", "lost"),
    ("release_per_s", "release/s"),
]


def cell(row, key):
    value = row.get(key)
    if key == "backend":
        return str(value).split("://")[0]
    if value is None:
        return "—"
    if isinstance(value, float) and not key.endswith("_pct"):
        return f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row.get('backend')} | failed: {row['error']} |")
        else:
            lines.append("| " + " | ".join(cell(row, k) for k, _ in COLUMNS) + " |")
    text = "\n".join(lines) + "\n"
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as out:
            out.write(text)
    print(text)


if __name__ == "__main__":
    main()
