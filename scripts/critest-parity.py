#!/usr/bin/env python3
"""critest parity: gantry against the engine's default runc path, from two Ginkgo JSON reports.

    scripts/critest-parity.py EXPECTED GANTRY_JSON RUNC_JSON

Fails (exit 1) when
  - a spec passes for runc and fails or is skipped for gantry;
  - a spec fails or is skipped for both handlers and EXPECTED does not list it with a reason;
  - gantry passes fewer specs than EXPECTED's `gantry passes at least N`.
EXPECTED's lines: `gantry passes at least N`, and `both: SPEC NAME | REASON` for every spec
that neither handler passes here; `#` starts a comment.
"""

import json
import sys


def states(path):
    with open(path) as f:
        suites = json.load(f)
    out = {}
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            name = " ".join([*(spec.get("ContainerHierarchyTexts") or []), spec["LeafNodeText"]])
            out[name] = spec["State"]
    return out


def expected(path):
    floor, both = 0, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("gantry passes at least "):
                floor = int(line.rsplit(" ", 1)[1])
            elif line.startswith("both: ") and " | " in line:
                name, reason = line[len("both: "):].rsplit(" | ", 1)
                both[name.strip()] = reason.strip()
            else:
                sys.exit(f"{path}:{n}: not understood: {line}")
    return floor, both


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    floor, both = expected(sys.argv[1])
    gantry, runc = states(sys.argv[2]), states(sys.argv[3])
    problems, notes = [], []
    for name in sorted(set(gantry) | set(runc)):
        g, r = gantry.get(name, "absent"), runc.get(name, "absent")
        if r == "passed" and g != "passed":
            problems.append(f"passes for runc, {g} for gantry: {name}")
        elif r != "passed" and g != "passed" and name not in both:
            problems.append(f"{g} for gantry and {r} for runc, and not listed in {sys.argv[1]}: {name}")
        elif g == "passed" and r != "passed":
            notes.append(f"passes for gantry only (runc: {r}): {name}")
        elif g == "passed" and name in both:
            notes.append(f"listed as failing for both, now passes for gantry: {name}")
    passed = {h: sum(s == "passed" for s in d.values()) for h, d in (("gantry", gantry), ("runc", runc))}
    print(f"critest parity: gantry {passed['gantry']} of {len(gantry)} passed, runc {passed['runc']} of {len(runc)};"
          f" {sum(1 for n in both if gantry.get(n) != 'passed')} listed as not passing for both")
    if passed["gantry"] < floor:
        problems.append(f"gantry passed {passed['gantry']} specs, fewer than the {floor} expected")
    for line in notes:
        print(f"  note: {line}")
    for line in problems:
        print(f"  FAIL: {line}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
