"""Where the test command's time went, read from cargo-nextest's JUnit report.

    python3 scripts/test-times.py target/nextest/default/junit.xml WALL_SECONDS

Prints the wall time, the ten slowest tests, the ten slowest test binaries (the sum of their
tests' times: tests run side by side, so these add up to more than the wall time) and a last
line `tests: N passed, N failed` that CI reads.
"""

import sys
import xml.etree.ElementTree as ElementTree


def main(report: str, wall: float) -> None:
    suites = ElementTree.parse(report).getroot().iter("testsuite")
    tests = []
    binaries = {}
    failed = 0
    for suite in suites:
        binary = suite.get("name", "?")
        for case in suite.iter("testcase"):
            seconds = float(case.get("time", "0"))
            tests.append((seconds, f"{binary} {case.get('name', '?')}"))
            binaries[binary] = binaries.get(binary, 0.0) + seconds
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
    minutes, seconds = divmod(int(wall), 60)
    print(f"\nwall time: {minutes} min {seconds:02d} s, {len(tests)} tests")
    print("slowest tests:")
    for seconds, name in sorted(tests, reverse=True)[:10]:
        print(f"  {seconds:8.1f} s  {name}")
    print("slowest test binaries (their tests' times added up):")
    for name, seconds in sorted(binaries.items(), key=lambda item: item[1], reverse=True)[:10]:
        print(f"  {seconds:8.1f} s  {name}")
    print(f"tests: {len(tests) - failed} passed, {failed} failed")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
