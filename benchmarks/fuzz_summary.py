"""The fuzz corpus through every command: how many inputs each got, and how each was answered.

    python benchmarks/fuzz_summary.py [--ci]

Runs tests/fuzz_inputs.py's full corpus (--ci: the smaller one tests/test_fuzz.py runs), each
case in-process under a time limit, and prints the table of docs/reliability.md: per command,
inputs tried, accepted, clear errors, tracebacks, hangs, unclear errors and half-written output
folders, then the number of inputs on which `validate` and `run` disagree. Exit status 1 when
anything but "accepted" and "clear error" occurred, or validate and run disagree.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz_inputs import all_cases, judge  # noqa: E402

COLUMNS = ("ok", "error", "traceback", "hang", "unclear", "half-written")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="the smaller corpus CI runs")
    args = parser.parse_args()
    cases = all_cases(full=not args.ci)
    counts: Counter[tuple[str, str]] = Counter()
    rejected: dict[tuple[str, str], bool] = {}
    problems: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chakra-sim-fuzz-") as tmp:
        for index, case in enumerate(cases):
            outcome = judge(case, Path(tmp) / str(index))
            counts[(case.command, outcome.verdict)] += 1
            if case.trace:
                rejected[(case.command, case.name)] = outcome.rejected
            if outcome.verdict not in ("ok", "error"):
                problems.append(f"{case.id}: {outcome.verdict}: {outcome.output.strip()[-300:]}")
    disagree = sorted(name for (command, name), no in rejected.items()
                      if command == "run" and rejected.get(("validate", name)) != no)
    commands = sorted({c.command for c in cases}, key=[c.command for c in cases].index)
    print(f"| command | inputs | {' | '.join('accepted' if c == 'ok' else c for c in COLUMNS)} |")
    print("| --- | " + " | ".join("---:" for _ in range(len(COLUMNS) + 1)) + " |")
    for command in commands:
        row = [counts[(command, verdict)] for verdict in COLUMNS]
        print(f"| `{command}` | {sum(row)} | " + " | ".join(map(str, row)) + " |")
    total = [sum(counts[(c, v)] for c in commands) for v in COLUMNS]
    print(f"| all | {sum(total)} | " + " | ".join(map(str, total)) + " |")
    print(f"\nvalidate and run disagree on {len(disagree)} of {sum(1 for k in rejected if k[0] == 'run')} "
          f"inputs{': ' + ', '.join(disagree) if disagree else ''}")
    print(f"{len(cases)} inputs in {time.perf_counter() - start:.1f} s")
    for problem in problems:
        print(problem)
    return 1 if problems or disagree else 0


if __name__ == "__main__":
    raise SystemExit(main())
