"""Serve one peer's workloads inside ``bench/.peers-venv``: one JSON request per line on
stdin (``workload``, ``database``, ``sizes``), one JSON sample (or ``error``) per line on
stdout, until stdin closes.

    bench/.peers-venv/bin/python bench/peer_run.py --serve SYSTEM
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import systems
from harness import BenchError, Database, Sizes


def main() -> None:
    system = sys.argv[2]
    module = systems.load(system)
    # Answers go to the real stdout; anything a library prints goes to stderr instead.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        database = Database(**request["database"])
        sizes = Sizes(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in request["sizes"].items()}
        )
        try:
            sample = module.IMPLEMENTATIONS[request["workload"]](database, sizes)
        except BenchError as error:
            answer = {"error": f"{system}: {error}"}
        except Exception as error:
            traceback.print_exc()
            answer = {"error": f"{system}: {type(error).__name__}: {error}"}
        else:
            answer = {"metrics": sample.metrics, "details": sample.details}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
