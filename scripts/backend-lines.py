#!/usr/bin/env python3
"""Non-test lines of the Rust files under each folder given (default: the contender-queue
family and its members). Left out: files whose name contains `tests`, and a trailing
`#[cfg(test)]` (+ `#[path]`) + `mod tests` block at the top level of a file (from the attribute to the end),
and the lines of a `#[cfg(test)]` (+ `#[path]`) `mod tests;` declaration wherever it stands.

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
    declared = 0
    for i, line in enumerate(lines[:-1]):
        rest = [l for l in lines[i + 1 : i + 3] if not l.startswith("#[path")]
        if line == "#[cfg(test)]" and rest and re.match(r"mod tests\b", rest[0]):
            if rest[0].rstrip().endswith(";"):
                # `mod tests;` (the tests are a file of their own) may stand among the other
                # modules: only its own lines are left out.
                declared += 2 + lines[i + 1].startswith("#[path")
                continue
            return i - declared
    return len(lines) - declared


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
