"""Targets (met or not, with the figure) and BENCHMARKS.md, from the results JSON files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ._dtype import dtype_section
from ._engines_report import engine_section, first_results_with
from ._quality import quality_markdown
from ._quality_scale import quality_scale_markdown
from ._remote_report import remote_section
from ._resident import resident_section

__all__ = ["RESULTS_DIR", "targets", "write_markdown"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
MARKDOWN = ROOT / "BENCHMARKS.md"
_BEGIN, _END = "<!-- results:begin -->", "<!-- results:end -->"


def _med(values) -> float:
    return float(statistics.median(values))


def _t(what: str, target: str, figure: str, met: bool) -> dict:
    return {"what": what, "target": target, "figure": figure, "met": bool(met)}


def targets(res: dict) -> list[dict]:
    """Each target of issue 5 as ``{what, target, figure, met}``."""
    if res.get("mode") == "cuda":
        return _gpu_targets(res)
    out = []
    st = res["stores"]
    pcb = st["percol-blosc"]
    cs_b = _med(pcb["chunkstream"]["default"])
    tp = _med(pcb["ceilings"]["thread_pool_reader"])
    orig = _med(pcb["original"])
    out.append(
        _t(
            "compressed per-column: vs the thread-pool reader",
            ">= 0.9x",
            f"{cs_b / tp:.2f}x ({cs_b:.2f} vs {tp:.2f} GB/s)",
            cs_b >= 0.9 * tp,
        )
    )
    out.append(
        _t(
            "compressed per-column: vs the original approach",
            ">= 1.3x",
            f"{cs_b / orig:.2f}x ({cs_b:.2f} vs {orig:.2f} GB/s)",
            cs_b >= 1.3 * orig,
        )
    )
    pcr = st["percol-raw"]
    cs_r = _med(pcr["chunkstream"]["default"])
    page = _med(pcr["ceilings"]["page_cache_read"])
    out.append(
        _t(
            "uncompressed per-column: vs the page-cache read",
            ">= 0.8x",
            f"{cs_r / page:.2f}x ({cs_r:.2f} vs {page:.2f} GB/s)",
            cs_r >= 0.8 * page,
        )
    )
    rates = pcb["chunkstream"]
    w1 = _med(rates["w1"])
    ks = sorted(int(k[1:]) for k in rates if k.startswith("w"))
    parts = [f"k={k}: {_med(rates[f'w{k}']) / w1:.2f}x" for k in ks[1:]]
    ok = all(_med(rates[f"w{k}"]) >= 0.8 * k * w1 for k in ks[1:])
    dec = pcb["ceilings"].get("decode_scaling", {})
    if len(dec) > 1:  # the machine's own limit: bare numcodecs decoding on k threads
        top = max(dec, key=lambda key: int(key[1:]))
        parts.append(
            f"(bare decode on this machine: {top[1:]} threads "
            f"{_med(dec[top]) / _med(dec['t1']):.2f}x one)"
        )
    out.append(
        _t(
            "scaling with workers (compressed per-column)",
            ">= 0.8k x one worker",
            ", ".join(parts) or "one core only",
            ok,
        )
    )
    ov = res["overlap"]
    for f in ("1.0", "0.5"):
        r = ov[f"train_{f}x"]["ratio"]
        out.append(
            _t(
                f"overlap, consumer at {f}x the read time",
                "<= 1.03x the bound",
                f"{r:.3f}x",
                r <= 1.03,
            )
        )
    w = ov["train_1.25x"]["wait_after_first_median_s"] * 1e3
    out.append(
        _t(
            "wait after the first chunk (training 1.25x slower than reading)",
            "<= 2 ms median",
            f"{w:.2f} ms",
            w <= 2.0,
        )
    )
    a = _med(ov["abandon"]["call_s"]) * 1e3
    out.append(
        _t(
            "abandoning and restarting an epoch",
            "<= 10 ms",
            f"{a:.2f} ms median, {max(ov['abandon']['call_s']) * 1e3:.2f} ms max",
            a <= 10,
        )
    )
    g = ov["rss"]["growth"]
    out.append(
        _t(
            f"RSS over {len(ov['rss']['rss_bytes'])} abandoned epochs",
            "<= 5% growth after 20",
            f"{g * 100:+.2f}% ({ov['rss']['rss_at_20'] / 2**20:.0f} MiB at epoch 20)",
            g <= 0.05,
        )
    )
    if "first_epoch" in res:
        out += first_epoch_targets(res["first_epoch"])
    for name, r in st.items():
        if "whole_job" not in r:
            continue
        mine = _med(r["whole_job"]["chunkstream"])
        best_key, best = max(((k, v["windows_per_s"]) for k, v in r["dataloader"].items()),
                             key=lambda kv: kv[1])  # fmt: skip
        out.append(
            _t(
                f"the whole job, {name}: vs the best DataLoader ({best_key})",
                ">= 50x",
                f"{mine / best:.0f}x ({mine:,.0f} vs {best:,.0f} windows/s)",
                mine >= 50 * best,
            )
        )
    return out


def first_epoch_targets(fe: dict) -> list[dict]:
    """A new loader's first epoch (issue 18), with the default arena (4 KiB pages, populated
    by the kernel) and, in brackets, the arena on transparent huge pages."""
    from ._first_epoch import summary

    got = summary(fe["pages"])
    huge = summary(fe["hugepages"])
    return [
        _t(
            "a new loader's first epoch vs its steady state",
            ">= 0.95x",
            f"{got['ratio']:.2f}x (arena on huge pages: {huge['ratio']:.2f}x)",
            got["ratio"] >= 0.95,
        ),
        _t(
            "time to a new loader's first chunk",
            "<= 1.5x a steady read, plus construction",
            f"{got['first_chunk_reads']:.2f}x a steady read ({got['first_chunk_s'] * 1e3:.0f} ms)"
            f" after {got['construct_s'] * 1e3:.0f} ms of construction"
            f" (huge pages: {huge['first_chunk_reads']:.2f}x after"
            f" {huge['construct_s'] * 1e3:.0f} ms)",
            got["first_chunk_reads"] <= 1.5,
        ),
    ]


def _gpu_targets(res: dict) -> list[dict]:
    out = []
    rates = res["scaling"]
    w1 = _med(rates["w1"])
    ks = sorted(int(k[1:]) for k in rates if k.startswith("w"))
    ok = all(_med(rates[f"w{k}"]) >= 0.8 * k * w1 for k in ks[1:])
    parts = [f"k={k}: {_med(rates[f'w{k}']) / w1:.2f}x" for k in ks[1:]]
    out.append(
        _t("scaling with workers (GPU machine)", ">= 0.8k x one worker", ", ".join(parts), ok)
    )
    h = res["h2d"]
    out.append(
        _t(
            "H2D from pinned slots vs torch's pinned-copy peak",
            "reported",
            f"{h['loader_gbps_median']:.1f} vs {h['peak_gbps_median']:.1f} GB/s",
            True,
        )
    )
    r = res["overlap"]["ratio"]
    out.append(_t("overlap with GPU matmul training", "<= 1.03x the bound", f"{r:.3f}x", r <= 1.03))
    w = res["overlap"]["wait_after_first_median_s"] * 1e3
    out.append(
        _t(
            "wait after the first chunk (GPU training slower)",
            "<= 2 ms median",
            f"{w:.2f} ms",
            w <= 2.0,
        )
    )
    mem = res["memory"]
    out.append(
        _t(
            "device memory vs the documented bound",
            "<= bound",
            f"{mem['peak_loader_bytes'] / 2**20:.0f} vs {mem['bound_bytes'] / 2**20:.0f} MiB",
            mem["peak_loader_bytes"] <= mem["bound_bytes"],
        )
    )
    return out


def _row(name: str, values, unit: str, scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return f"| {name} | {min(v):,.2f} | {_med(v):,.2f} | {max(v):,.2f} | {unit} | {len(v)} |"


def _section(res: dict) -> list[str]:
    mc = res["machine"]
    lines = [
        f"### {res['mode']} run",
        "",
        f"- command: `{res['command']}` ({res['seconds'] / 60:.1f} min)",
        f"- machine: {mc['cpu']}, {mc['cores']} cores, {mc['ram_gb']} GiB RAM; disk `{mc['disk']}`",
        f"- 1-minute load: {mc['load_1min_before']:.2f} before, {res['load_1min_after']:.2f} after "
        "(the machine is shared)",
        "- versions: "
        + ", ".join(f"{k} {v}" for k, v in mc["versions"].items())
        + f"; python {mc['python']}; commit {mc['commit']}",
        f"- geometry: {res['geometry']}",
        "",
        "| target | wanted | figure | met |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t['what']} | {t['target']} | {t['figure']} | {'yes' if t['met'] else '**no**'} |"
              for t in res["targets"]]  # fmt: skip
    if res["mode"] == "cuda":
        lines += ["", "```json", json.dumps({k: res[k] for k in ("h2d", "memory", "overlap",
                  "host_blocking")}, indent=1, default=str)[:4000], "```", ""]  # fmt: skip
        return lines
    for name, r in res["stores"].items():
        s = r["store"]
        lines += ["", f"#### {name}: chunks {tuple(s['chunks'])}, {s['codec']}, "
                  f"{s['decoded_bytes'] / 1e9:.2f} GB decoded, {s['disk_bytes'] / 1e9:.2f} GB on disk",
                  "", "| figure | min | median | max | unit | n |", "|---|---|---|---|---|---|"]  # fmt: skip
        c = r["ceilings"]
        lines.append(_row("ceiling: memcpy", c["memcpy"], "GB/s"))
        if "page_cache_read" in c:
            lines.append(
                _row("ceiling: page-cache read of the window", c["page_cache_read"], "GB/s")
            )
        lines.append(_row("ceiling: memcpy, 1 thread", c["memcpy_1_thread"], "GB/s"))
        for k, v in c.get("decode_scaling", {}).items():
            label = f"bare numcodecs decode of chunks in memory, {k[1:]} threads (decoded bytes)"
            lines.append(_row(label, v, "GB/s"))
        lines.append(
            _row(
                "ceiling: thread-pool reader (mmap + decode, all cores)",
                c["thread_pool_reader"],
                "GB/s",
            )
        )
        for k, v in r["chunkstream"].items():
            if isinstance(v, list):
                label = (
                    "defaults (workers=2, decode pool = all cores)"
                    if k == "default"
                    else (f"workers={k[1:]}, decode pool of {k[1:]}")
                )
                lines.append(_row(f"chunkstream {label}", v, "GB/s"))
        lines.append(_row("original approach", r["original"], "GB/s"))
        if "whole_job" in r:
            lines.append(_row("whole job: chunkstream", r["whole_job"]["chunkstream"], "windows/s"))
            lines.append(
                _row("whole job: original approach", r["whole_job"]["original"], "windows/s")
            )
            for k, v in r["dataloader"].items():
                lines.append(_row(f"whole job: DataLoader {k}", [v["windows_per_s"]], "windows/s"))
    ov = res["overlap"]
    lines += ["", "#### overlap (percol-blosc, sleeping consumer)", "",
              f"read: {ov['read']['interval_s'] * 1e3:.1f} ms per chunk steady, first chunk "
              f"{ov['read']['first_s'] * 1e3:.1f} ms", "",
              ("The bound's read interval is the mean of the intervals measured just before "
               "and just after each run; the median run of each consumer speed is shown, with "
               "every run's ratio, the ratio with the interval before the run alone, and the "
               "ratio to the bound of the reads the run really made."
               if "ratio_before_only" in ov["train_1.0x"] else
               "The bound's read interval was measured just before each run (this run predates "
               "the interval measured around each run); the last column but one is the ratio "
               "to the bound of the reads the run really made."), "",
              "| consumer | epoch s | bound s | ratio | runs | before only | own reads "
              "| wait after first, median / max ms |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for f in ("1.0", "0.5", "1.25"):
        o = ov[f"train_{f}x"]
        runs = ", ".join(f"{r:.3f}" for r in o.get("ratios", [o["ratio"]]))
        before = f"{o['ratio_before_only']:.3f}" if "ratio_before_only" in o else "-"
        lines.append(
            f"| {f}x read | {o['elapsed_s']:.3f} | {o['bound_s']:.3f} | {o['ratio']:.3f} | "
            f"{runs} | {before} | {o['ratio_own_reads']:.3f} | "
            f"{o['wait_after_first_median_s'] * 1e3:.2f} / {o['wait_after_first_max_s'] * 1e3:.2f} |"
        )
    lines.append("")
    lines.append(
        _row("abandon + restart: the epoch() call", ov["abandon"]["call_s"], "ms", 1e3).join(
            ["| figure | min | median | max | unit | n |\n|---|---|---|---|---|---|\n", ""]
        )
    )
    lines.append(
        _row("abandon + restart: to the first chunk", ov["abandon"]["first_chunk_s"], "ms", 1e3)
    )
    return [*lines, ""]


def write_markdown(results_dir: Path = RESULTS_DIR, markdown: Path = MARKDOWN) -> None:
    """Rewrite the results part of ``markdown`` from every results file in ``results_dir``."""
    body = []
    for mode in ("full", "quick", "cuda"):
        path = results_dir / f"{mode}.json"
        if path.exists():
            body += _section(json.loads(path.read_text()))
        elif mode == "cuda":
            body += ["### cuda run", "", "Not run: no NVIDIA GPU was available when these "
                     "figures were taken. `benchmarks/gpu.sh` is ready for one.", ""]  # fmt: skip
    body += engine_section(results_dir)
    body += dtype_section(first_results_with(results_dir, ("dtype", "dtype-quick"), "dtype"))
    body += resident_section(
        first_results_with(results_dir, ("resident", "resident-quick"), "resident")
    )
    body += remote_section(results_dir)
    body += quality_markdown(results_dir)
    body += quality_scale_markdown(results_dir)
    text = markdown.read_text() if markdown.exists() else f"# Benchmarks\n\n{_BEGIN}\n{_END}\n"
    head, _, rest = text.partition(_BEGIN)
    _, _, tail = rest.partition(_END)
    markdown.write_text(head + _BEGIN + "\n" + "\n".join(body) + "\n" + _END + tail)
