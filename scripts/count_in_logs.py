#!/usr/bin/env python3
"""Counts a marker in the test output a nextest JUnit report stored.

Usage: count_in_logs.py REPORT MARKER

Prints how many times MARKER occurs in the stored stdout and stderr of the
report's test cases, and which tests printed it; exits 1 if it occurs at all,
2 if the report cannot be read. (.ci/run counts the etcd client's GOAWAYs of
its own this way: `too_many_internal_resets`, which must stay 0.)
"""
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    report, marker = sys.argv[1], sys.argv[2]
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"cannot read {report}: {e}", file=sys.stderr)
        return 2
    total, stored, where = 0, 0, []
    for case in root.iter("testcase"):
        for out in list(case.iter("system-out")) + list(case.iter("system-err")):
            stored += 1
            n = (out.text or "").count(marker)
            if n:
                total += n
                where.append(f"{case.get('classname')} {case.get('name')}: {n}")
    print(f"{marker}: {total} in the output of {len(where)} test(s) ({stored} outputs stored)")
    for w in where:
        print(f"  {w}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
