"""The worker process of `autotile tune --devices` and `autotile batch`:
`python -m autotile.tuning.host_worker PAYLOAD`.

The payload (JSON) names the role: "tune" searches one study until its budget is spent, "batch" takes
problems of a batch study one after another.
"""

from __future__ import annotations

import json
import sys

from autotile.errors import AutotileError, InvalidValueError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    payload = json.loads(argv[0])
    try:
        if payload["role"] == "tune":
            from autotile.tuning.parallel import run_tune_worker

            run_tune_worker(payload)
        elif payload["role"] == "batch":
            from autotile.tuning.batch import run_batch_worker

            run_batch_worker(payload)
        else:
            raise InvalidValueError(f"unknown worker role {payload['role']!r}")
    except AutotileError as exc:
        print(f"autotile worker: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
