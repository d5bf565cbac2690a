"""The reliability table of docs/reliability.md, from the JUnit XML of a run of the fault suite:

pytest tests/faults --junitxml=faults.xml && python -m tests.faults.table faults.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def table(junit_xml: str) -> str:
    """One row a recorded case, the default's first, each mode's by test name: the same table from any run, however
    its workers shared the cases out."""
    rows = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        if "fault" not in props:
            continue
        failed = case.find("failure") is not None or case.find("error") is not None
        result = "FAILED" if failed else "skipped" if case.find("skipped") is not None else "passed"
        mode = props.get("mode", "per-step")
        row = f"| {mode} | {props['fault']} | {props['where']} | {result} | {props['outcome']} |"
        rows.append((mode != "default", case.get("classname"), case.get("name"), row))
    header = ["| mode | fault | where | result | outcome |", "|---|---|---|---|---|"]
    return "\n".join([*header, *(row for *_, row in sorted(rows))])


if __name__ == "__main__":
    print(table(sys.argv[1]))
