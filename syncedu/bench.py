"""Benchmarks: `python -m syncedu.bench {launch,collectives} [options]`.

Results and the commands that produced them are in the README.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncedu.bench", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("launch", help="cold launch.run vs bare spawn vs warm Pool.run")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if args.what == "launch":
        from tqdm import tqdm

        from syncedu.lab import bench_launch

        with tqdm(total=args.repeat, desc="launch rounds", file=sys.stderr) as bar:
            m = bench_launch.measure(args.world_size, args.repeat, progress=bar.update)
        print(bench_launch.report(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
