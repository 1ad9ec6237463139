"""Re-stamp shipped records after a template change that leaves the compiled kernels unchanged.

A record keeps `source_sha`, the hash of the source it timed; a template change that alters the text
(a refactor, comments) retires it, even where the machine code is the same. For each record under
cache/, this renders its config with the templates of a git revision (REV) and with today's, compiles
both with NVRTC for the record's architecture and the library's options, and only where the two cubins
are byte-identical writes today's `source_sha` into the record (and `restamped_from`, the old hash).
Records whose code differs are listed and left alone: they need a re-tune.

    python tools/restamp.py REV [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RENDER = """
import json, sys
from autotile import kernels
for line in sys.stdin:
    r = json.loads(line)
    spec = kernels.get(r["kernel"])
    try:
        src = spec.render(spec.space.config(r["config"]), r["dtype"], r["layout"])
    except Exception:  # a config this tree's space cannot hold (a parameter or value added since)
        src = None
    print(json.dumps(src))
"""


def render_all(tree: Path, records: list[dict]) -> list[str | None]:
    """Each record's source as the autotile in `tree` renders it (a separate interpreter per tree); None
    where that tree cannot render the record's config."""
    lines = "".join(json.dumps(r) + "\n" for r in records)
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", RENDER], input=lines, capture_output=True, text=True, env=env,
                         check=True, cwd=tree)
    return [json.loads(line) for line in out.stdout.splitlines()]


def cubin(source: str, arch: str) -> bytes:
    from autotile import build

    return build.compile(source, arch).binary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision whose templates rendered the records' sources")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from autotile import kernels

    paths = sorted((ROOT / "cache").glob("*/*.json"))
    records = [json.loads(p.read_text()) for p in paths]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(f"git -C {ROOT} archive {args.rev} | tar -x -C {tmp}", shell=True, check=True)
        old = render_all(Path(tmp), records)
    new = render_all(ROOT, records)
    changed = 0
    for path, record, old_src, new_src in zip(paths, records, old, new, strict=True):
        env = record["environment"]
        if old_src is None or env.get("source_sha") != kernels.source_hash(old_src):
            print(f"skip {path.name}: its source_sha is not {args.rev}'s render")
            continue
        arch = "sm_" + path.parent.name.rsplit("_sm_", 1)[-1]  # the device folder ends in the arch: ..._sm_90
        if cubin(old_src, arch) != cubin(new_src, arch):
            print(f"DIFFERS {path.name}: the compiled kernel changed; re-tune it")
            continue
        if env["source_sha"] == kernels.source_hash(new_src):
            continue
        env["restamped_from"] = env["source_sha"]
        env["source_sha"] = kernels.source_hash(new_src)
        changed += 1
        if not args.dry_run:
            path.write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n")
    print(f"{changed} of {len(paths)} records re-stamped (identical cubins){' (dry run)' if args.dry_run else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
