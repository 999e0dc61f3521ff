"""The "remote stores" section of BENCHMARKS.md: the table and the decision, from the figures.

Rendered from the first results file that holds the race, in a fixed order
(``remote.json`` from ``--only remote``, then ``full.json``, ``remote-quick.json``,
``quick.json``). The decision is the issue's rule applied to the figures
(``_remote.remote_decision``), next to what the code does, so a rerun that flips
the figures says so.
"""

from __future__ import annotations

from pathlib import Path

from ._engines_report import first_results_with

__all__ = ["remote_section"]

_SOURCES = ("remote", "full", "remote-quick", "quick")
_SERVERS = {"http": "HTTP (threaded `http.server`)", "s3": "S3 (moto server)"}
_STORES = {
    "obstore": "zarr `ObjectStore` over obstore, no wrapper",
    "fsspec": "zarr `FsspecStore` + `RetryingStore` (before)",
}
_KINDS = ("500", "stall", "drop")


def _load(results_dir: Path) -> dict | None:
    return first_results_with(results_dir, _SOURCES, "remote")


def _failed(entry: dict) -> str:
    """The table's cell for a store that failed (``_remote`` recorded its error)."""
    return "failed: " + entry["failed"].replace("|", "/")


def _row(server: str, store: str, r: dict) -> str:
    t = r["throughput"][server][store]
    f = r["faults"][server][store]
    gbps = (_failed(t) if "failed" in t
            else f"{t['min']:.3f} / {t['median']:.3f} / {t['max']:.3f} ({t['n']})")  # fmt: skip

    def cells(cell) -> str:  # a figure per fault kind, "failed: ..." where the row failed
        if all("failed" in f[k] for k in _KINDS) and len({f[k]["failed"] for k in _KINDS}) == 1:
            return "failed (each kind)" if "failed" in t else _failed(f[_KINDS[0]])
        return " / ".join(_failed(f[k]) if "failed" in f[k] else cell(f[k]) for k in _KINDS)

    transient = cells(lambda x: "identical" if x["transient_identical"] else "**differs**")
    seconds = cells(lambda x: f"{x['seconds_to_error']:.2f}")
    hits = cells(lambda x: str(x["persistent_hits"]))
    named = all("failed" not in f[k] and f[k]["raised"] == "ChunkLoadError" and f[k]["names_url"]
                and f[k]["names_window"] for k in _KINDS)  # fmt: skip
    return (f"| {_SERVERS[server]} | {_STORES[store]} | {gbps} | {transient} | "
            f"{'yes' if named else '**no**'} | {seconds} | {hits} |")  # fmt: skip


def _decision(r: dict) -> str:
    from chunkstream.sources._remote import OBSTORE_SCHEMES

    d = r["decision"]
    measured = [f"{x:.2f}x ({s.upper()})" for s, x in d["obstore_over_fsspec"].items()
                if x is not None]  # fmt: skip
    failed = [s.upper() for s, x in d["obstore_over_fsspec"].items() if x is None]
    ratios = (f"at {' and '.join(measured)} the baseline's median GB/s" if measured
              else "with no ratio to the baseline")  # fmt: skip
    if failed:
        ratios += f" ({' and '.join(failed)}: a store failed, no ratio)"
    contract = ("meets the fault contract on both servers" if d["contract_met"]["obstore"]
                else "**misses the fault contract** (see the rows above)")  # fmt: skip
    code_uses_obstore = "http" in OBSTORE_SCHEMES and "s3" in OBSTORE_SCHEMES
    if d["obstore_default"] and code_uses_obstore:
        return (f"**Decision:** obstore alone {contract} and reads {ratios}, so it is the "
                "default for `s3://`, `gs://`, `az://` and "
                "`http(s)://` (`sources/_remote.py`), which now adds only obstore's bounds "
                "from `RemoteOptions` and the mapping of its errors into `RemoteStoreError` "
                "(naming the window and field). fsspec + `RetryingStore` is gone from the "
                "library; it lives on only as this race's baseline "
                "(`benchmarks/_fsspec_baseline.py`).")  # fmt: skip
    if not d["obstore_default"] and not code_uses_obstore:
        return (f"**Decision:** obstore {contract} and reads {ratios}; fsspec + "
                "`RetryingStore` stays the default.")  # fmt: skip
    return (f"**Decision: the figures and the code disagree.** obstore {contract} and reads "
            f"{ratios}; the rule says "
            f"{'obstore' if d['obstore_default'] else 'fsspec + RetryingStore'}, the code uses "
            f"{'obstore' if code_uses_obstore else 'fsspec'}. Rerun under less load, or revisit.")  # fmt: skip


def remote_section(results_dir: Path) -> list[str]:
    """The section's lines (empty when no results file holds the race)."""
    res = _load(results_dir)
    if res is None:
        return []
    r = res["remote"]
    g, b = r["geometry"], r["bounds"]
    chunk_kib = g["chunk_steps"] * g["width"] * 4 / 2**10
    lines = [
        "### remote stores",
        "",
        f"- command: `{res['command']}` ({res['seconds'] / 60:.1f} min); 1-minute load "
        f"{r['load_1min_before']:.2f} before the race, {r['load_1min_after']:.2f} after",
        f"- a window: {g['chunks_per_window']} uncompressed zarr chunks of {chunk_kib:.0f} KiB "
        f"({r['window_bytes'] / 2**20:.0f} MiB), {g['windows']} windows a repeat, zarr "
        f"`async.concurrency` {r['concurrency']}; both stores bounded alike: {b['timeout_s']:g} s "
        f"per request, {b['retries']} retries, backoff {b['backoff_s']:g} to "
        f"{b['max_backoff_s']:g} s",
        "- servers on 127.0.0.1 behind the tests' fault hook (`tests/faults.py`); GB/s is "
        "bounded by these Python servers, so it compares the clients, not a network",
        "- faults, through a `ChunkLoader` with its own retries off: 2 transient faults of each "
        "kind, then one chunk failing for good; the error must be a `ChunkLoadError` naming the "
        "chunk's URL and the window",
        "",
        "| server | store | GB/s min / median / max (n) | data after 2 transient 500 / stall "
        "/ drop | persistent: error names URL and window | persistent 500 / stall / drop: s to "
        "the error | requests served the failing chunk |",
        "|---|---|---|---|---|---|---|",
    ]
    for server in r["throughput"]:
        for store in _STORES:
            lines.append(_row(server, store, r))
    lines += ["", _decision(r), ""]
    return lines
