"""Re-stamp shipped records after a template change that leaves the compiled kernels unchanged.

A record keeps `source_sha`, the hash of the source it timed; a template change that alters the text
(a refactor, comments) retires it, even where the machine code is the same. For each record under
cache/, this renders its config with the templates of a git revision (REV) and with today's, compiles
both with NVRTC for the record's architecture and the library's options, and only where the two cubins
are byte-identical writes today's `source_sha` into the record (and `restamped_from`, the old hash).
The shape databases' candidates (cache/*/database/) are handled the same way. Records whose code differs
are listed and left alone: they need a re-tune. NVRTC now and then compiles a source to a different
cubin after other compiles in the same process; a second run re-stamps what such a flake left out.

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
from autotile.codegen import kernels
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
    """The cubin NVRTC builds from `source` for `arch` ("sm_90"; "sm_90a" where the source needs it)."""
    from autotile.codegen import build

    target = build.target_arch(int(arch.removeprefix("sm_")), build.needs_arch_specific(source))
    return build.compile(source, target).binary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the git revision whose templates rendered the records' sources")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from autotile.codegen import kernels

    # Records (one config each) and the shape databases' candidates (many per file), as one list of
    # (file, the dict holding `config` and the hash, where the hash lives in it).
    paths = sorted((ROOT / "cache").glob("*/*.json")) + sorted((ROOT / "cache").glob("*/database/*.json"))
    documents = {p: json.loads(p.read_text()) for p in paths}
    items: list[tuple[Path, dict, dict, str]] = []  # (file, render request, holder of the hash, hash key)
    for path, doc in documents.items():
        if "candidates" in doc:
            for cand in doc["candidates"]:
                if cand.get("config") is not None:
                    request = {"kernel": doc["kernel"], "dtype": doc["dtype"], "layout": doc["layout"],
                               "config": cand["config"]}
                    items.append((path, request, cand, "source_sha"))
        else:
            items.append((path, doc, doc["environment"], "source_sha"))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(f"git -C {ROOT} archive {args.rev} | tar -x -C {tmp}", shell=True, check=True)
        old = render_all(Path(tmp), [request for _, request, _, _ in items])
    new = render_all(ROOT, [request for _, request, _, _ in items])
    changed = 0
    touched: set[Path] = set()
    for (path, _request, holder, field), old_src, new_src in zip(items, old, new, strict=True):
        if old_src is None or new_src is None or holder.get(field) != kernels.source_hash(old_src):
            continue
        if holder[field] == kernels.source_hash(new_src):
            continue
        arch = "sm_" + path.parents[1 if path.parent.name == "database" else 0].name.rsplit("_sm_", 1)[-1]
        if cubin(old_src, arch) != cubin(new_src, arch):
            print(f"DIFFERS {path.name} {holder.get('name', '')}: the compiled kernel changed; re-tune it")
            continue
        holder["restamped_from"] = holder[field]
        holder[field] = kernels.source_hash(new_src)
        changed += 1
        touched.add(path)
    if not args.dry_run:
        for path in touched:
            # as the file was: the shape databases on one line (`database.save`), records indented
            one_line = path.read_text().count("\n") <= 1
            text = json.dumps(documents[path], separators=(",", ":"), allow_nan=False) if one_line else \
                json.dumps(documents[path], indent=2, sort_keys=True, allow_nan=False)
            path.write_text(text + "\n")
    print(f"{changed} of {len(items)} configs re-stamped (identical cubins){' (dry run)' if args.dry_run else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
