"""A process that reads a whole remote array through a cache folder (tests/test_cache.py).

``python -m tests.cache_worker URL DIR BUDGET OUT [--reverse] [--fsize BYTES]``: reads
every timestep window by window (``--reverse``: last window first), saves the array to
``OUT`` (``.npy``) and prints the cache's counters and any warnings as one JSON line.
``BUDGET`` is ``cache_bytes`` (``none``: the default). ``--fsize`` caps the size of any
file this process writes (``RLIMIT_FSIZE``): a full disk, as the cache sees one;
``--nobody`` (run as root) drops to user ``nobody``, for whom the folder is unwritable;
``--cache-group G`` shares the folder with group ``G``; ``--from-env`` gives the folder
(and the group) through ``CHUNKSTREAM_CACHE`` (``CHUNKSTREAM_CACHE_GROUP``) instead. The
JSON line also holds the sum and the sha256 of what was read (``OUT`` may be ``-``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import signal
import warnings

import numpy as np

import chunkstream as cs
from chunkstream.sources._remote import RemoteOptions

WINDOW = 40


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("folder")
    parser.add_argument("budget")
    parser.add_argument("out")
    parser.add_argument("--reverse", action="store_true")
    parser.add_argument("--fsize", type=int)
    parser.add_argument("--nobody", action="store_true", help="drop root's rights first")
    parser.add_argument("--cache-group")
    parser.add_argument("--from-env", action="store_true")
    args = parser.parse_args()
    if args.nobody:
        os.setgid(65534)
        os.setuid(65534)
    if args.fsize is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, hard))
    budget = None if args.budget == "none" else int(args.budget)
    options = {"chunkstream": RemoteOptions(timeout=20.0, retries=2, backoff=0.01)}
    cache: dict = {"cache": args.folder, "cache_group": args.cache_group}
    if args.from_env:
        os.environ["CHUNKSTREAM_CACHE"] = args.folder
        if args.cache_group is not None:
            os.environ["CHUNKSTREAM_CACHE_GROUP"] = args.cache_group
        cache = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cs.CacheWarning)
        with cs.ZarrSource(
            args.url, cache_bytes=budget, storage_options=options, **cache
        ) as source:
            total = len(source)
            spec = source.fields["data"]
            result = np.empty((total, *spec.shape), spec.dtype)
            starts = list(range(0, total, WINDOW))
            for start in reversed(starts) if args.reverse else starts:
                stop = min(start + WINDOW, total)
                source.read_into(start, stop, {"data": result[start:stop]})
            counters = source.cache.counters.as_dict()
    if args.fsize is not None:  # the output is the test's, not the cache's
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    if args.out != "-":
        np.save(args.out, result)
    found = [str(w.message) for w in caught if issubclass(w.category, cs.CacheWarning)]
    digest = hashlib.sha256(result.tobytes()).hexdigest()
    summary = {"sum": float(result.sum(dtype=np.float64)), "sha256": digest}
    print(json.dumps({**counters, "warnings": found, **summary}), flush=True)


if __name__ == "__main__":
    main()
