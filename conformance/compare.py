"""Counts of two JUnit reports of the suite, and the tests the first passes and the second does not.

python conformance/compare.py OUT/nccl.xml OUT/nccl_core.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def outcomes(path: str) -> dict[str, str]:
    """Test id -> passed / failed / skipped."""
    result = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        if case.find("skipped") is not None:
            result[name] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        else:
            result[name] = "passed"
    return result


def main() -> int:
    reference, candidate = (outcomes(path) for path in sys.argv[1:3])
    for label, report in (("reference", reference), ("candidate", candidate)):
        kinds = list(report.values())
        counts = {kind: kinds.count(kind) for kind in ("passed", "failed", "skipped")}
        print(label, sys.argv[1 if label == "reference" else 2], counts)
    lost = sorted(t for t, o in reference.items() if o == "passed" and candidate.get(t) != "passed")
    print(f"{len(lost)} tests pass on the reference and not on the candidate:")
    for test in lost:
        print(" ", test, candidate.get(test, "missing"))
    # Where ranks share a GPU, tests that name a device by rank fail on both: not counted as
    # passing, listed apart.
    both = sorted(t for t, o in reference.items() if o == "failed" and candidate.get(t) == "failed")
    print(f"{len(both)} tests fail on both:")
    for test in both:
        print(" ", test)
    if not any(o == "passed" for o in reference.values()):
        print("the reference passed no test: the comparison says nothing")
        return 1
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
