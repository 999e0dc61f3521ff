"""Segments: the stretches of the time axis that pieces and windows must stay inside.

A recording is often several recordings, conditions or train/val/test ranges laid
end to end; a training window that crosses a boundary between two of them is a
sample that never happened. :class:`Segments` is a sorted list of disjoint
``[start, stop)`` ranges, each with a name; every piece a plan makes and every
window the consumer samples lies inside one of them.

:func:`split_segments` cuts every segment into consecutive train/val/test ranges
(per condition, so each split sees every condition), with ``gap`` timesteps
dropped between them so that no window of one split overlaps another.
"""

from __future__ import annotations

import csv
import json
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError, check_int

__all__ = ["Segment", "Segments", "split_segments"]

_SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class Segment:
    """One stretch ``[start, stop)`` of the time axis, named."""

    start: int
    stop: int
    name: str

    def __len__(self) -> int:
        return self.stop - self.start


def _timestep(name: str, value: object, where: str) -> int:
    """A segment bound as an int: an integer, or its text as read from a CSV file."""
    if isinstance(value, bool):
        raise ConfigError.bad(name, value, f"an int ({where})", "Give timesteps as integers.")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise ConfigError.bad(
            name, value, f"an int ({where})", "Give timesteps as integers."
        ) from None


class Segments(Sequence[Segment]):
    """A sorted sequence of disjoint, non-empty, named ``[start, stop)`` ranges.

    Build it from ``(start, stop)`` or ``(start, stop, name)`` items (unnamed ones
    are called ``"seg<i>"``), or read it with :meth:`read` from a CSV file
    (``start,stop[,name]`` per line, an optional header) or a JSON file (a list
    of ``[start, stop(, name)]`` or ``{"start", "stop", "name"}``, or an object
    ``{name: [start, stop]}``). Unsorted, overlapping or empty ranges raise
    :class:`~chunkstream.ConfigError`; :meth:`check` also checks them against a
    source's length.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[object] | Segments) -> None:
        if isinstance(items, Segments):
            self._items: tuple[Segment, ...] = items._items
            return
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise ConfigError.bad(
                "segments",
                type(items).__name__,
                "a sequence of (start, stop) or (start, stop, name), or a cs.Segments",
                "Read a file with cs.Segments.read(path).",
            )
        parsed = []
        for i, item in enumerate(items):
            where = f"segment {i}"
            if isinstance(item, Segment):
                parsed.append(item)
                continue
            if isinstance(item, (str, bytes)) or not isinstance(item, Sequence):
                raise ConfigError.bad(
                    "segments", item, f"(start, stop) or (start, stop, name) ({where})"
                )
            if len(item) not in (2, 3):
                raise ConfigError.bad(
                    "segments", item, f"(start, stop) or (start, stop, name) ({where})"
                )
            start = _timestep("segments", item[0], where)
            stop = _timestep("segments", item[1], where)
            name = str(item[2]) if len(item) == 3 else f"seg{i}"
            parsed.append(Segment(start, stop, name))
        if not parsed:
            raise ConfigError.bad("segments", items, "at least one segment", "Pass None for none.")
        for i, seg in enumerate(parsed):
            if seg.start < 0:
                raise ConfigError.bad(
                    "segments",
                    (seg.start, seg.stop, seg.name),
                    "start >= 0",
                    "Segments index the source's time axis [0, T).",
                )
            if seg.stop <= seg.start:
                raise ConfigError.bad(
                    "segments",
                    (seg.start, seg.stop, seg.name),
                    "a non-empty range (stop > start)",
                    f"Drop segment {i} or fix its bounds.",
                )
            if i and seg.start < parsed[i - 1].stop:
                prev = parsed[i - 1]
                order = "overlaps" if seg.start >= prev.start else "comes before"
                raise ConfigError.bad(
                    "segments",
                    (seg.start, seg.stop, seg.name),
                    f"segments sorted by start and disjoint ({seg.name!r} {order} "
                    f"{prev.name!r} = [{prev.start}, {prev.stop}))",
                    "Sort them by start and merge or trim the overlapping ones.",
                )
        names = [s.name for s in parsed]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ConfigError.bad("segments", dup, "unique segment names", "Rename the duplicate.")
        self._items = tuple(parsed)

    # -- Sequence ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):  # type: ignore[override]
        return self._items[i]

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Segments) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        inner = ", ".join(f"({s.start}, {s.stop}, {s.name!r})" for s in self._items[:4])
        more = f", ... {len(self) - 4} more" if len(self) > 4 else ""
        return f"Segments([{inner}{more}])"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._items)

    @property
    def timesteps(self) -> int:
        """Timesteps inside the segments, together."""
        return sum(len(s) for s in self._items)

    def check(self, total_timesteps: int) -> Segments:
        """``self``, after checking every segment lies inside ``[0, total_timesteps)``."""
        last = self._items[-1]
        if last.stop > total_timesteps:
            raise ConfigError.bad(
                "segments",
                (last.start, last.stop, last.name),
                f"ranges inside [0, {total_timesteps}) (the source's timesteps)",
                "Check the segments belong to this source.",
            )
        return self

    # -- files -------------------------------------------------------------------------

    @classmethod
    def read(cls, path: str | Path) -> Segments:
        """Segments from a ``.json`` file or a CSV file (any other suffix); see the class."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError.bad(
                "segments", str(path), "a readable CSV or JSON file", f"{exc.strerror}."
            ) from exc
        if path.suffix.lower() == ".json":
            return cls._from_json(text, path)
        return cls._from_csv(text, path)

    @classmethod
    def _from_json(cls, text: str, path: Path) -> Segments:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError.bad(
                "segments",
                str(path),
                "valid JSON",
                f"Line {exc.lineno}, column {exc.colno}: {exc.msg}.",
            ) from None
        if isinstance(data, Mapping):
            data = [(*v, k) if isinstance(v, list) else v for k, v in data.items()]
        if not isinstance(data, list):
            raise ConfigError.bad("segments", str(path), "a JSON list or object of segments")
        items = []
        for i, entry in enumerate(data):
            if isinstance(entry, Mapping):
                try:
                    entry = (entry["start"], entry["stop"], entry.get("name", f"seg{i}"))
                except KeyError as exc:
                    raise ConfigError.bad(
                        "segments", f"{path} entry {i}", f"a 'start' and a 'stop' key ({exc})"
                    ) from None
            items.append(entry)
        return cls(items)

    @classmethod
    def _from_csv(cls, text: str, path: Path) -> Segments:
        items = []
        for lineno, row in enumerate(csv.reader(text.splitlines()), start=1):
            cells = [c.strip() for c in row]
            if not cells or not any(cells) or cells[0].startswith("#"):
                continue
            if lineno == 1 and cells[0].lower() == "start":
                continue  # a header
            try:
                if len(cells) not in (2, 3):
                    raise ValueError(f"{len(cells)} columns")
                start, stop = int(cells[0]), int(cells[1])
            except ValueError as exc:
                raise ConfigError.bad(
                    "segments",
                    f"{path} line {lineno}: {','.join(row)!r}",
                    "start,stop or start,stop,name with integer start and stop",
                    f"Fix line {lineno} ({exc}).",
                ) from None
            items.append((start, stop, cells[2]) if len(cells) == 3 else (start, stop))
        return cls(items)


def as_segments(segments: object, total_timesteps: int) -> Segments:
    """``segments`` (anything :class:`Segments` takes, or a path) checked against ``[0, T)``."""
    if isinstance(segments, (str, Path)):
        segments = Segments.read(segments)
    return Segments(segments).check(total_timesteps)  # type: ignore[arg-type]


def split_segments(
    segments: object,
    fractions: Sequence[float] | Mapping[str, float] = (0.7, 0.1, 0.2),
    gap: int = 0,
) -> dict[str, Segments]:
    """Cut every segment into consecutive ranges, one per split: ``{"train": ..., ...}``.

    ``fractions`` (summing to 1) are the splits' shares of each segment, in order;
    a plain sequence names them ``train``, ``val``, ``test`` (two: ``train``,
    ``val``), a mapping names them itself. ``gap`` timesteps are dropped between
    consecutive ranges of one segment (use the model's window minus one so that
    no window sees two splits); the shares apply to what is left. Each range is
    named ``"<segment>/<split>"``. A range that comes out empty (a short
    segment) is left out of its split; a split left with no range raises.
    """
    segs = Segments(segments if not isinstance(segments, (str, Path)) else Segments.read(segments))
    if isinstance(fractions, Mapping):
        names, shares = list(fractions), list(fractions.values())
    else:
        shares = list(fractions)
        if not 1 <= len(shares) <= len(_SPLIT_NAMES):
            raise ConfigError.bad(
                "fractions", fractions, "1 to 3 fractions, or a {name: fraction} mapping"
            )
        names = list(_SPLIT_NAMES[: len(shares)])
    try:
        shares = [float(s) for s in shares]
    except (TypeError, ValueError):
        raise ConfigError.bad("fractions", fractions, "numbers in [0, 1]") from None
    if any(not 0 <= s <= 1 for s in shares) or not math.isclose(sum(shares), 1.0, abs_tol=1e-6):
        raise ConfigError.bad(
            "fractions",
            fractions,
            f"fractions in [0, 1] that sum to 1 (they sum to {sum(shares):g})",
            "E.g. (0.7, 0.1, 0.2) for train/val/test.",
        )
    check_int("gap", gap, 0, "Use the batch window minus one.")
    out: dict[str, list[tuple[int, int, str]]] = {n: [] for n in names}
    for seg in segs:
        usable = len(seg) - gap * (len(shares) - 1)
        if usable <= 0:
            continue
        # Cumulative rounding: the ranges tile the usable length exactly.
        bounds = [round(usable * sum(shares[:i])) for i in range(len(shares) + 1)]
        at = seg.start
        for i, name in enumerate(names):
            size = bounds[i + 1] - bounds[i]
            if size > 0:
                out[name].append((at, at + size, f"{seg.name}/{name}"))
            at += size + gap
    empty = [n for n, ranges in out.items() if not ranges]
    if empty:
        raise ConfigError.bad(
            "fractions",
            fractions,
            f"a share that leaves split {empty[0]!r} at least one timestep",
            "Raise its fraction, lower gap, or use longer segments.",
        )
    return {name: Segments(ranges) for name, ranges in out.items()}


@dataclass(frozen=True)
class HeldOutSplit:
    """Where training streams from and what is held out (:func:`held_out_split`).

    ``train_segments`` is ``None`` without segments: training then streams
    ``[0, train_len)``. ``val_ranges`` holds ``(name, start, stop)`` per held-out
    range: the one range after training, or each segment's held-out tail that
    holds a window.
    """

    train_len: int
    train_segments: Segments | None
    val_ranges: list[tuple[str, int, int]]

    @property
    def val_len(self) -> int:
        """Timesteps of the held-out ranges (what validation keeps on the device)."""
        return sum(stop - start for _, start, stop in self.val_ranges)


def held_out_split(
    total_timesteps: int, val_fraction: float, window: int = 1, segments: object = None
) -> HeldOutSplit:
    """How the trainer splits ``total_timesteps`` for ``val_fraction``; ``plan`` reports it.

    Without ``segments`` the last ``int(total_timesteps * val_fraction)`` timesteps
    (rounded down, and at least one ``window`` when ``val_fraction > 0``) are held
    out and training gets ``[0, train_len)``, which may be shorter than a window:
    callers check. With ``segments`` (anything :class:`Segments` takes, or a path,
    checked against ``[0, total_timesteps)``) the last ``val_fraction`` of every
    segment is held out, ``window - 1`` timesteps dropped between the two so that
    no window sees both (:func:`split_segments`); a held-out tail shorter than a
    window is left out of ``val_ranges``, which may then be empty: callers check.
    """
    if segments is None:
        held = int(total_timesteps * val_fraction)
        if val_fraction > 0:
            held = max(window, held)
        train = total_timesteps - held
        return HeldOutSplit(train, None, [("val", train, total_timesteps)] if held else [])
    segs = as_segments(segments, total_timesteps)
    if val_fraction == 0:
        return HeldOutSplit(segs.timesteps, segs, [])
    try:
        splits = split_segments(
            segs, fractions={"train": 1.0 - val_fraction, "val": val_fraction}, gap=window - 1
        )
    except ConfigError as exc:  # said in split_segments' terms: say it in the caller's
        raise ConfigError.bad(
            "val_fraction",
            val_fraction,
            f"a share of every segment that holds at least one timestep after the "
            f"{window - 1}-step gap before it (window - 1)",
            "Raise val_fraction, use longer segments or a shorter window.",
        ) from exc
    val = [(v.name, v.start, v.stop) for v in splits["val"] if len(v) >= window]
    return HeldOutSplit(splits["train"].timesteps, splits["train"], val)
