#!/usr/bin/env python3
"""Non-test lines of the Rust files under each folder given (default: the contender-queue
family and its members). Left out: files whose name contains `tests`, and a trailing
`#[cfg(test)]` (+ `#[path]`) + `mod tests` block at the top level of a file (from the attribute to the end).

    scripts/backend-lines.py [DIR...]
"""
import os
import re
import sys

BACKENDS = "crates/distlock/src/backends"
DEFAULT = [f"{BACKENDS}/zookeeper", f"{BACKENDS}/etcd", f"{BACKENDS}/contenders"]


def count(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines[:-1]):
        rest = [l for l in lines[i + 1 : i + 3] if not l.startswith("#[path")]
        if line == "#[cfg(test)]" and rest and re.match(r"mod tests\b", rest[0]):
            return i
    return len(lines)


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    total = 0
    for d in sys.argv[1:] or DEFAULT:
        n = sum(
            count(os.path.join(root, f))
            for root, _, files in os.walk(d)
            for f in files
            if f.endswith(".rs") and "tests" not in f
        )
        print(f"{n:6d} {d}")
        total += n
    print(f"{total:6d} total")


main()
