"""A benchmark consumer process: ``python bench/consumer.py SYSTEM MODE --url URL …``.

Started by the harness so that the consumer has its own interpreter (and GIL), as a real
worker would. It reports through JSON lines on stdout (see ``harness.Consumer``).
"""

from __future__ import annotations

import argparse

import systems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", choices=sorted(systems.SYSTEMS))
    parser.add_argument("mode", choices=["drain", "latency"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--option", action="append", default=[], help="backend option k=v")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefetch", type=int, help="claim-ahead (default: the system's)")
    parser.add_argument("--expect", type=int, required=True, help="messages to handle")
    parser.add_argument(
        "--gate", action="store_true", help="report ready, then start on a line on stdin"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after (s)")
    args = parser.parse_args()
    systems.load(args.system).consume(args)


if __name__ == "__main__":
    main()
