"""The fault soak, long: `python bench/soak.py --minutes 30 --seed N [--backend B]`.

Three `dblockrun daemon` processes per server backend run the soak's job mix
while the nemesis (from the seed, printed; the same seed plays the same
schedule again) kills, freezes, disconnects, clock-shifts and reloads them;
then the checker reads every record and the commands' own log. Prints the
figures per backend: faults injected by kind, slots checked, records, runs,
violations (each one listed). Exit status 1 if any backend has a violation.
The code is shared with tests/test_soak.py (tests/faultsoak/).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

# This checkout's dblockrun (the daemons run from it too) and its tests/.
REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from common import URLS, Table, bench_prefix  # noqa: E402
from faultsoak.soak import Report, run_soak  # noqa: E402

from dblockrun.store import Store  # noqa: E402

BACKENDS = ("postgresql", "mariadb")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=None,
                        help="the length in seconds instead (a test's replay)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the nemesis's seed (default: a new one, printed)")
    parser.add_argument("--backend", choices=BACKENDS, action="append",
                        help="repeatable; default: both")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the daemons' and commands' logs in DIR/BACKEND")
    args = parser.parse_args()
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    reports: list[Report] = []
    for backend in args.backend or BACKENDS:
        with tempfile.TemporaryDirectory(prefix=f"soak-{backend}-") as tmp:
            if args.keep is not None:
                tmp = str(args.keep / backend)
                Path(tmp).mkdir(parents=True, exist_ok=True)
            url, prefix = URLS[backend](tmp), bench_prefix()
            print(f"== {backend}: seed {seed}, {seconds:g} s, table prefix {prefix}",
                  flush=True)
            try:
                report = run_soak(url, prefix, backend, seconds, seed, Path(tmp),
                                  log=lambda line: print(line, flush=True))
            finally:
                with Store(url, prefix) as store:
                    store.drop_schema()
        for v in report.violations:
            print(f"  {v}")
        print(report.figures(), flush=True)
        reports.append(report)
    print()
    table = Table(["backend", "faults", "by kind", "slots", "records", "runs", "violations"])
    for r in reports:
        table.add([r.backend, sum(r.injected.values()),
                   " ".join(f"{k}:{n}" for k, n in sorted(r.injected.items())),
                   r.slots, r.records, r.runs, len(r.violations)])
    table.print()
    print(f"replay: python bench/soak.py --seconds {seconds:g} --seed {seed}")
    return 1 if any(r.violations for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
