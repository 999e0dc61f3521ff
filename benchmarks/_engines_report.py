"""The "decode engines" section of BENCHMARKS.md: the table and the decision, from the figures.

The section is rendered from the first results file that holds a race, in a
fixed order (``engines.json`` from ``--only engines``, then ``full.json``,
``engines-quick.json``, ``quick.json``), so a clean clone renders the same text.
The decision is the issue's rule applied to the medians (``engine_decision``),
next to what the code does, so a rerun that flips the figures says so.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["engine_section"]

_SOURCES = ("engines", "full", "engines-quick", "quick")
_LIBRARIES = ("zarrs", "tensorstore", "zarr")
_LABELS = {
    "chunkstream": "ours (`_fastzarr.py`)",
    "zarrs": 'zarrs, through `ZarrSource(engine="zarrs")`',
    "zarrs-unchecked": "zarrs, missing-chunk check off",
    "tensorstore": "tensorstore, `TensorStoreSource` (tuned context)",
    "zarr": "zarr-python's default pipeline (the floor)",
}


def first_results_with(results_dir: Path, modes: tuple[str, ...], key: str) -> dict | None:
    """The first of ``results_dir/<mode>.json`` (in ``modes`` order) that holds ``key``."""
    for mode in modes:
        path = results_dir / f"{mode}.json"
        if path.exists():
            res = json.loads(path.read_text())
            if key in res:
                return res
    return None


def _load(results_dir: Path) -> dict | None:
    return first_results_with(results_dir, _SOURCES, "engines")


def _fmt(f: dict) -> str:
    return f"{f['min']:.2f} / {f['median']:.2f} / {f['max']:.2f}"


def _table(e: dict) -> list[str]:
    lines = [
        "| store | engine | GB/s min / median / max | CPU s per GB min / median / max "
        "| median GB/s vs ours | same data |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in e["stores"].items():
        ours = r["engines"]["chunkstream"]["gbps"]["median"]
        for engine, f in r["engines"].items():
            label = _LABELS.get(engine, engine)
            if engine == "chunkstream" and not r["fast_path"]:
                label = "ours: not eligible, so zarr's pipeline"
            ratio = f["gbps"]["median"] / ours
            lines.append(
                f"| {name} | {label} | {_fmt(f['gbps'])} | {_fmt(f['cpu_s_per_gb'])} | "
                f"{ratio:.2f}x | {'yes' if r['matches'][engine] else '**no**'} |"
            )
    return lines


def _decision(e: dict) -> list[str]:
    d, tol = e["decision"], e["tolerance"]
    stores = e["stores"]
    lines = [
        f"**Rule** (issue 11): a library becomes the default engine, and our reader is deleted, "
        f"where its median GB/s is within {tol:.0%} of ours or faster on every store.",
        "",
    ]
    for lib in _LIBRARIES:
        per = d["ratios"][lib]
        short = [n for n, v in per.items() if v < 1 - tol]
        ratios = ", ".join(f"{n} {v:.2f}x" for n, v in per.items())
        verdict = "qualifies" if not short else f"does not qualify (behind on {', '.join(short)})"
        lines.append(f"- {lib}: {ratios} of ours: {verdict}.")
    eligible = [n for n, r in stores.items() if r["fast_path"]]
    cpu_best = {
        n: min(r["engines"], key=lambda k: r["engines"][k]["cpu_s_per_gb"]["median"])
        for n, r in stores.items()
    }
    lines.append(
        "- least CPU per GB (median): " + ", ".join(f"{n} {k}" for n, k in cpu_best.items()) + "."
    )
    check = {}
    for n, r in stores.items():
        on, off = r["engines"]["zarrs"]["gbps"], r["engines"]["zarrs-unchecked"]["gbps"]
        inside = off["min"] <= on["median"] <= off["max"]
        check[n] = f"{on['median'] / off['median']:.2f}x" + (
            " (within its spread)" if inside else ""
        )
    lines.append(
        "- zarrs reads an absent chunk as the fill value (as zarr does) and raises for a "
        "truncated or corrupt frame; `ZarrSource` keeps its own missing-chunk check on that "
        "engine, which costs (GB/s with the check over without): "
        + ", ".join(f"{n} {v}" for n, v in check.items())
        + "."
    )
    for n, r in stores.items():
        if not r["fast_path"]:  # `auto` and `zarr` run the same code here: the noise floor
            same = (
                r["engines"]["zarr"]["gbps"]["median"]
                / r["engines"]["chunkstream"]["gbps"]["median"]
            )
            lines.append(
                f'- noise: on {n} `auto` and `engine="zarr"` run the same code; their medians '
                f"differ by {abs(1 - same):.0%}."
            )
    lines.append("")
    if d["qualifies"]:
        lines.append(
            f"**Decision: the rule picks {', '.join(d['qualifies'])}, but the code still "
            "defaults to our reader: these figures have not been acted on yet.**"
        )
    else:
        lines.append(
            "**Decision: no library qualifies, so our reader stays the default engine** "
            '(`ZarrSource(engine="auto")` uses it wherever the array suits it: '
            + ", ".join(eligible)
            + " here). Why it wins: a chunk that several fields need is decoded once (the "
            "engines that go field by field decode each interleaved chunk twice), every chunk "
            "of every field goes to one pool at once, whole chunks decode straight into the "
            "caller's buffer, and uncompressed chunk files are read into it with no copy."
        )
    for name, r in stores.items():
        if r["fast_path"]:
            continue
        ours = r["engines"]["chunkstream"]["gbps"]["median"]
        best = max(_LIBRARIES, key=lambda k: r["engines"][k]["gbps"]["median"])
        lines.append(
            f"On {name} our reader does not apply and `auto` falls back to zarr's pipeline; "
            f"there {best} delivers {r['engines'][best]['gbps']['median'] / ours:.2f}x that and "
            f"zarrs {r['engines']['zarrs']['gbps']['median'] / ours:.2f}x. zarrs stays an "
            'opt-in engine (`pip install chunkstream[zarrs]`, `engine="zarrs"`) for such '
            "arrays, not a default: on the stores our reader takes it delivers "
            + ", ".join(f"{n} {d['ratios']['zarrs'][n]:.2f}x" for n in eligible)
            + " of ours."
        )
    return lines


def engine_section(results_dir: Path) -> list[str]:
    """The section's lines (a note that the race was not run if no results hold it)."""
    res = _load(results_dir)
    if res is None:
        return ["### decode engines", "", "Not run yet: `python -m benchmarks.run --only "
                "engines` measures it.", ""]  # fmt: skip
    e, mc = res["engines"], res["machine"]
    loads = ", ".join(f"{n} {r['load_1min']:.2f}" for n, r in e["stores"].items())
    lines = [
        "### decode engines",
        "",
        f"- command: `{res['command']}` ({res['seconds'] / 60:.1f} min)",
        f"- machine: {mc['cpu']}, {mc['cores']} cores; commit {mc['commit']}; versions "
        + ", ".join(f"{k} {v}" for k, v in mc["versions"].items() if v),
        f"- 1-minute load: {mc['load_1min_before']:.2f} before, before each store {loads}, "
        f"{res['load_1min_after']:.2f} after",
        f"- each repeat reads {e['windows']} random windows of "
        f"{e['window_nbytes'] / 2**20:.0f} MiB (voltage + stimulus; other windows in each "
        "repeat, the same for every engine) into the same buffers, one window at a time; "
        f"{e['repeats']} repeats, engines in turn; CPU seconds from getrusage (all threads)",
        "",
        *_table(e),
        "",
        *_decision(e),
        "",
    ]
    return lines
