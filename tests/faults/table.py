"""The reliability table of ``docs/reliability.md``, from the JUnit XML of a run of the fault suite, written between
the page's markers:

    FAULT_TABLE=rewrite pytest tests/faults --junitxml=faults.xml && python -m tests.faults.table faults.xml

Every case checks its own row against the page as it records it (:func:`tests.faults.common.record`), so the page
holds what the suite's run gives; with ``FAULT_TABLE=rewrite`` a run whose rows changed records them without that
check, for this command to write.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
REGION = re.compile(r"(<!-- fault-suite: table -->\n)(.*?)(<!-- /fault-suite -->)", re.S)
HEADER = ["| mode | fault | where | result | outcome |", "|---|---|---|---|---|"]


def row(mode: str, fault: str, where: str, result: str, outcome: str) -> str:
    return f"| {mode} | {fault} | {where} | {result} | {outcome} |"


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
        line = row(mode, props["fault"], props["where"], result, props["outcome"])
        rows.append((mode != "default", case.get("classname"), case.get("name"), line))
    return "\n".join([*HEADER, *(line for *_, line in sorted(rows))])


def rows_on_page(page: Path = PAGE) -> list[str]:
    match = REGION.search(page.read_text())
    return match[2].splitlines()[len(HEADER) :] if match else []


def write(junit_xml: str, page: Path = PAGE) -> None:
    text = page.read_text()
    page.write_text(REGION.sub(lambda m: m[1] + table(junit_xml) + "\n" + m[3], text))


if __name__ == "__main__":
    write(sys.argv[1])
