"""How well the selection model predicts cuBLAS's time, each shipped database's shapes held out in turn (CPU only).

For every shape of every shipped matmul and bmm database whose reference is cuBLAS, cuBLAS's time is predicted
from the other shapes (`autotile.dispatch.model.Model.reference_ms`, the neighbours the model's choice uses),
once as the library does and once with the alignment split off (every neighbour counted as the same kind),
and compared with the measured time. Prints the mean |log2(predicted / measured)| per database, by problem size
(multiply-adds) and by whether cuBLAS's rows are aligned (`cublas_rows_aligned`): the measurements behind
REFERENCE_KIND_DISTANCE, REFERENCE_KIND_MIN_WORK and REFERENCE_WORK_EXPONENT. Re-run it after a survey
changes a database.

    python tools/reference_loo.py [--neighbours N] [--work-exponent E]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from unittest import mock

import numpy as np

from autotile.codegen.limits import PROFILES, DeviceLimits
from autotile.dispatch import model as model_mod
from autotile.dispatch.database import ShapeDatabase

ROOT = Path(__file__).resolve().parent.parent
BANDS = (0, 2**26, 2**28, 2**30, 2**32)  # multiply-adds: each band from one edge to the next


def held_out_errors(db: ShapeDatabase, device: DeviceLimits, neighbours: int) -> list[tuple[int, bool, float]]:
    """For each shape cuBLAS timed: its multiply-adds, whether its rows are aligned as cuBLAS wants, and
    |log2(predicted / measured)| of cuBLAS's time predicted from the other shapes."""
    m = model_mod.Model(db, device)
    if m.reference != m.cublas or m.cublas is None:
        return []
    params = model_mod.ModelParams(neighbours=neighbours)
    out = []
    for i, shape in enumerate(tuple(int(d) for d in s) for s in db.shapes):
        measured = m.times[i, m.cublas]
        if not np.isfinite(measured) or measured <= 0:
            continue
        dist = m._distances(shape)
        dist[i] = np.inf
        predicted = m.reference_ms(shape, m._nearest(dist, params), dist)
        if predicted is not None:
            out.append((math.prod(shape), model_mod.cublas_rows_aligned(db.kernel, db.dtype, db.layout, shape),
                        abs(math.log2(predicted / measured))))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--neighbours", type=int, default=model_mod.ModelParams().neighbours)
    parser.add_argument("--work-exponent", type=float, default=model_mod.REFERENCE_WORK_EXPONENT,
                        help="a neighbour's time scaled by the ratio of multiply-adds to this power "
                             "(REFERENCE_WORK_EXPONENT; default the library's)")
    args = parser.parse_args()
    model_mod.REFERENCE_WORK_EXPONENT = args.work_exponent
    devices = {p.fingerprint: p for p in PROFILES.values()}
    print("mean |log2(predicted / measured)| of cuBLAS's time, each shape held out: as the library predicts "
          "(without the alignment split); n shapes")
    print(f"{'database':<52} " + " ".join(f"{'from 2^' + str(int(math.log2(max(b, 1)))):>17}" for b in BANDS))
    for path in sorted(ROOT.glob("cache/*/database/*.json")):
        device = devices.get(path.parent.parent.name)
        db = ShapeDatabase.from_json(json.loads(path.read_text()))
        if device is None or db.kernel not in ("matmul", "bmm"):
            continue
        split = held_out_errors(db, device, args.neighbours)
        with mock.patch.object(model_mod, "REFERENCE_BY_ALIGNMENT", ()):
            unsplit = held_out_errors(db, device, args.neighbours)
        if not split:
            continue
        for aligned in (True, False):
            cells = []
            for lo, hi in zip(BANDS, (*BANDS[1:], math.inf), strict=True):
                now = [e for w, a, e in split if lo <= w < hi and a == aligned]
                before = [e for w, a, e in unsplit if lo <= w < hi and a == aligned]
                cells.append(f"{np.mean(now):.2f} ({np.mean(before):.2f}) {len(now):>3}" if now else "-")
            name = f"{device.name} {db.kernel} {db.dtype} {db.layout} {'aligned' if aligned else 'unaligned'}"
            print(f"{name:<52} " + " ".join(f"{c:>17}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
