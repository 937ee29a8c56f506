"""One benchmark, this checkout against an earlier commit, in the same run.

    python bench/compare.py --baseline REF [--rounds 2] -- BENCH.py [ARGS...]

The earlier commit is checked out in a temporary git worktree (removed at
the end). Each round runs the benchmark once against the baseline, then
once against this checkout, so a busy machine slows both alike; every
dblockrun process a benchmark starts (``python -m dblockrun``) imports the
checkout named by ``PYTHONPATH``, which is all that differs between the two.
Both outputs are printed, labelled, round by round; compare their rows (the
benchmark's own medians) side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="a commit, branch or tag")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- BENCH.py [ARGS...]")
    args = ap.parse_args()
    bench = [a for a in args.bench if a != "--"]
    if not bench:
        ap.error("name a benchmark after --")
    tmp = Path(tempfile.mkdtemp(prefix="dblockrun-baseline-"))
    base = tmp / "checkout"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base),
                    args.baseline], check=True)
    sha = subprocess.run(["git", "-C", str(base), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=True).stdout.strip()
    here = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    failed = False
    try:
        for n in range(1, args.rounds + 1):
            for label, checkout in ((f"baseline {sha}", base), (f"this checkout {here}", ROOT)):
                print(f"=== round {n}: {label}: {' '.join(bench)}", flush=True)
                env = {**os.environ, "PYTHONPATH": str(checkout)}
                code = subprocess.call([sys.executable, str(HERE / bench[0]), *bench[1:]],
                                       env=env, cwd=checkout)
                failed = failed or code != 0
                print(flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                       check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        raise SystemExit("a benchmark run failed")


if __name__ == "__main__":
    main()
