"""Only the overlap figures of the full run, three times: `python -m benchmarks.overlap_only`.

Same store, repeats and code as `benchmarks.run`; prints each epoch time over both bounds.
"""

from benchmarks import run as r
from benchmarks._stores import Geometry, store_specs, warm

geo = Geometry.full()
reps = r.Reps.full()
spec = next(s for s in store_specs(geo) if s.name == "percol-blosc")
warm(spec)
reps = r.Reps(**{**reps.__dict__, "rss_epochs": 22, "abandon": 2})
for trial in range(3):
    out = r.run_overlap(spec, geo, reps)
    for k in ("train_1.0x", "train_0.5x", "train_1.25x"):
        o = out[k]
        print(
            f"{trial} {k} vs mean-read bound {o['ratio']:.3f} "
            f"vs own-reads bound {o['ratio_own_reads']:.3f} "
            f"wait med {o['wait_after_first_median_s'] * 1e3:.2f} ms",
            flush=True,
        )
