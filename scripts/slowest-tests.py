#!/usr/bin/env python3
"""The slowest tests of a nextest run, from its JUnit report.

    scripts/slowest-tests.py [JUNIT_XML] [N]

Prints N lines (default 12), slowest first: seconds, test binary, test name.
"""
import sys
import xml.etree.ElementTree as ET


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "target/nextest/default/junit.xml"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    cases = [
        (float(c.get("time", "0")), c.get("classname", ""), c.get("name", ""))
        for c in ET.parse(path).getroot().iter("testcase")
    ]
    total = sum(t for t, _, _ in cases)
    print(f"slowest {n} of {len(cases)} tests ({total:.0f} s of test time in all):")
    for t, binary, name in sorted(cases, reverse=True)[:n]:
        print(f"{t:8.1f} s  {binary}  {name}")


if __name__ == "__main__":
    main()
