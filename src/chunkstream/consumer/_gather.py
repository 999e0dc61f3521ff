"""The host gather: windows copied into a batch by a small bounded pool of threads.

Gathering a batch on the host is ``B`` copies of one contiguous window each
(``window`` rows of a field). torch's ``index_select`` runs them on its intra-op
pool, whose threads spin at a barrier waiting for a thread the OS has
descheduled: on a busy machine (several ranks per node, each with readers,
decoders and torch's own pools) one batch then costs tens of times its idle
CPU time. Here each window is one numpy slice copy (a ``memcpy`` that releases
the GIL), the windows are cut into blocks, and the blocks are *claimed* one at
a time by the calling thread and the pool's helper threads: nobody waits at a
barrier, a helper the OS does not run simply claims nothing, and the caller
ends up doing the work itself. The caller waits (on a condition, never
spinning) only for blocks a helper has already claimed.

Concurrency: one :class:`GatherPool` serves any number of callers (each call is
a job of its own, whose value or error lands in its
:class:`~concurrent.futures.Future`, as an executor's calls do); the helpers end
after :data:`IDLE_S` without work, so an idle process holds no
``chunkstream-gather-*`` thread, and start again on the next call; at
interpreter exit a pool's finalizer stops and joins them (:func:`_stop_helpers`:
a daemon thread dropping torch tensors while the interpreter finalizes aborts
the process). That is why
the helpers are not an :class:`~chunkstream._executor.Executor`, whose threads
live as long as their owner: the process's default pool
(:func:`gather_pool`) serves :func:`~chunkstream.gather_windows`, a plain
function with no owner to close it.

Waits: a caller waits at :data:`~chunkstream._executor.POLL_S`, the one poll
interval, bounded by a :class:`Watch` as a loader's wait for a chunk is: the
loader's ``close()`` ends it, and no block finished for ``stall_timeout``
raises :class:`~chunkstream.LoaderStalledError` with the stacks of the helpers
inside a block (a copy out of a memory-mapped file on a hung mount never
returns). A job given a watch (the host tier's batches, its buffer's rows) is
gathered by the helpers alone, so its caller, free, sees a stall; an unwatched
job (the plain :func:`~chunkstream.gather_windows`) is also claimed by its
caller, which a stuck block of its own would hold (only the helpers' are
watched, under a default :class:`Watch`).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from .._errors import ConfigError, LoaderClosedError, LoaderStalledError, check_int
from .._executor import done_within, thread_stack
from .._memory import thread_budget

__all__ = [
    "IDLE_S",
    "GatherPool",
    "Job",
    "Watch",
    "default_gather_threads",
    "gather_blocks",
    "gather_pool",
    "host_gather",
]

IDLE_S = 0.5  # a helper with nothing to claim for this long ends
EXIT_JOIN_S = 5.0  # at interpreter exit, the helpers' jobs get this long to finish
_MAX_THREADS = 4  # a batch gather is memory bound: more threads than this buy nothing


def _usable_cores() -> int:
    """This process's share of the node's CPUs (:func:`chunkstream._memory.node_share`)."""
    return thread_budget()


def default_gather_threads() -> int:
    """Threads that copy a batch (the caller counted): this rank's share of the cores, at most 4.

    The share is the process's thread budget (:func:`chunkstream._memory.node_share`:
    its CPUs, affinity and cgroup quota, over the ranks of the job on this node), so
    several ranks on a node do not oversubscribe it through their gathers.
    """
    return max(1, min(_MAX_THREADS, _usable_cores()))


def check_gather_threads(threads: object) -> int:
    """``threads`` (``None``: :func:`default_gather_threads`) as an int >= 1."""
    if threads is None:
        return default_gather_threads()
    return check_int(
        "gather_threads",
        threads,
        1,
        "Pass None for this rank's share of the cores (at most 4), or e.g. 1 to gather "
        "each batch in the consuming thread alone.",
    )


@dataclass(frozen=True)
class Watch:
    """How a caller waits for a job it does not gather itself: like a reader's chunk.

    ``closed()`` true (the loader was closed) ends the wait within
    :data:`~chunkstream._executor.POLL_S` with :class:`LoaderClosedError`; no block
    finished in the pool for ``stall_timeout`` s (``None``: never) since the job was
    submitted ends it with :class:`LoaderStalledError` holding the stacks of the
    helpers inside a block (a copy out of a memory-mapped file on a hung mount never
    returns). Either way the job is cancelled: its slot comes back once the claimed
    blocks end; a helper stuck in one stays stuck (a thread cannot be stopped), as a
    loader's reader does.
    """

    stall_timeout: float | None = 300.0
    closed: Callable[[], bool] = lambda: False

    def check(self, job: Job) -> None:
        """Raise if the wait for ``job`` must end (after cancelling it)."""
        if self.closed():
            job.cancel()
            raise LoaderClosedError(
                "the loader was closed while a batch was being gathered; create a new "
                "ChunkLoader and BatchStream (or do not call close() before the last batch)"
            )
        timeout = self.stall_timeout
        if timeout is not None and time.monotonic() - job.progress() >= timeout:
            job.cancel()
            stacks = job.activity.stacks()
            raise LoaderStalledError(
                f"no gather block finished for {timeout:.1f} s (stall_timeout) while a batch "
                "was being gathered; the batch is abandoned"
                + (". Stuck gather threads:\n" + "\n".join(stacks) if stacks else "")
            )


class _Activity:
    """A pool's progress, for a :class:`Watch`: when a block last finished, and which
    thread is inside which job's block (one dict entry set or popped per block: atomic)."""

    __slots__ = ("busy", "last")

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.busy: dict[threading.Thread, str] = {}

    def stacks(self) -> list[str]:
        stacks = (thread_stack(t, what) for t, what in dict(self.busy).items())
        return [s for s in stacks if s is not None]


class Job:
    """One call's blocks: claimed by the helpers (and, unwatched, by its caller), then
    ``then`` once.

    ``then(failed)`` runs exactly once, in whichever thread finishes the last
    block (or in :meth:`cancel`'s), with ``failed`` true after an error or a
    cancel; its value (or the first error) is :attr:`future`'s result. Keep it
    short: it runs on a helper (the host tier's gives a failed job's slot back).
    :meth:`wait` (after claiming what is left, for an unwatched job) returns that
    value or raises, bounded by ``watch``.
    """

    __slots__ = (
        "activity",
        "cancelled",
        "claimed",
        "closed",
        "done",
        "error",
        "fn",
        "future",
        "lock",
        "n",
        "submitted",
        "then",
        "watch",
    )

    def __init__(
        self,
        fn: Callable[[int], None],
        n: int,
        then: Callable[[bool], object] | None = None,
        *,
        watch: Watch | None = None,
        activity: _Activity | None = None,
    ) -> None:
        self.fn, self.n, self.then, self.watch = fn, n, then, watch
        self.activity = _Activity() if activity is None else activity
        self.submitted = time.monotonic()
        self.claimed = 0  # blocks handed out (to the caller or a helper)
        self.done = 0  # blocks finished, with or without an error
        self.error: BaseException | None = None
        self.cancelled = self.closed = False
        self.lock = threading.Lock()  # the counters: claims come from several threads
        self.future: Future = Future()
        if n <= 0:
            self.closed = True
            self._close()

    def progress(self) -> float:
        """When this job last saw progress (``monotonic``): its submission, or the last
        block its pool finished since."""
        return max(self.submitted, self.activity.last)

    def succeeded(self) -> bool:
        """Whether the job is over, every block done without error and not cancelled
        (never waits)."""
        future = self.future
        return future.done() and future.exception(0) is None and not self.cancelled

    def claim(self) -> int | None:
        with self.lock:
            if self.claimed >= self.n or self.error is not None:
                return None
            self.claimed += 1
            return self.claimed - 1

    def _block_done(self, error: BaseException | None) -> None:
        with self.lock:
            self.done += 1
            if error is not None and self.error is None:
                self.error = error
                self.n = self.claimed  # nothing more is claimed after an error
            last = self.done >= self.n and not self.closed
            self.closed = self.closed or last
        if last:
            self._close()

    def _close(self) -> None:
        value = None
        try:
            if self.then is not None:
                value = self.then(self.cancelled or self.error is not None)
        except BaseException as exc:  # a thread boundary: handed on through the future
            if self.error is None:
                self.error = exc
        finally:
            self.fn = self.then = None  # type: ignore[assignment]  # drop the arrays
            if self.error is not None:
                self.future.set_exception(self.error)
            else:
                self.future.set_result(value)

    def run_blocks(self) -> None:
        me, activity = threading.current_thread(), self.activity
        while (block := self.claim()) is not None:
            activity.busy[me] = f"gathering block {block} of {self.n}"
            try:
                self.fn(block)
            except BaseException as exc:  # a thread boundary: handed on through the future
                self._block_done(exc)
            else:
                self._block_done(None)
            finally:
                activity.busy.pop(me, None)
                activity.last = time.monotonic()

    def wait(self) -> object:
        """Claim what is left (an unwatched job: a watched one is the helpers' alone, so
        its caller stays free to see a stall), wait for the blocks others claimed and
        ``then``, polling at :data:`~chunkstream._executor.POLL_S`; ``then``'s value, or
        the first error raised. A watched job's :class:`Watch` may end the wait; an
        unwatched one waits as a default :class:`Watch` (no close, the loader's
        default ``stall_timeout``)."""
        watch = self.watch
        if watch is None:
            self.run_blocks()
            watch = _UNWATCHED
        while not done_within(self.future):
            watch.check(self)
        return self.future.result()

    def cancel(self) -> bool:
        """Claim nothing more; ``then(True)`` runs once the claimed blocks are done.
        Whether the job had already finished every block without error (its output
        is then the caller's: ``then(False)`` ran or is running)."""
        with self.lock:
            if self.closed:
                return self.error is None and not self.cancelled and self.done >= self.n
            self.cancelled = True
            self.n = self.claimed
            last = self.done >= self.n
            self.closed = last
        if last:
            self._close()
        return False


_UNWATCHED = Watch()


class GatherPool:
    """``threads - 1`` helper threads (``chunkstream-gather-<k>``) plus each calling thread;
    ``threads`` helpers for a watched job, which its caller does not gather.

    :meth:`submit` queues ``fn(block)`` for every block in ``range(n)``; the
    helpers start on it at once and the caller's :meth:`Job.wait` claims what
    is left (unwatched), so a submitted job is gathered in the background while the
    caller does other work. :meth:`run` is submit-and-wait. Thread-safe; helpers start
    on demand and end when idle (module docs).
    """

    def __init__(self, threads: int) -> None:
        self.threads = check_gather_threads(threads)
        # Entered as ``with self._lock`` (C code), never ``with self._cond``: a signal
        # handler that raises inside Condition.__enter__, a Python function, after it
        # took the lock would leak it (bpo-29988), and the main thread takes this one.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._jobs: deque[Job] = deque()
        self._helpers = _Helpers(self._lock, self._cond)
        self._activity = _Activity()
        self._started = 0  # helper names count up, so a name is never reused while alive
        # At interpreter exit (a finalizer's atexit call, before the interpreter starts
        # finalizing): the helpers stop and are joined (_stop_helpers).
        weakref.finalize(self, _stop_helpers, self._helpers, EXIT_JOIN_S)

    def submit(
        self,
        fn: Callable[[int], None],
        n: int,
        then: Callable[[bool], object] | None = None,
        *,
        watch: Watch | None = None,
    ) -> Job:
        job = Job(fn, n, then, watch=watch, activity=self._activity)
        helpers = self.threads - (watch is None)  # an unwatched job's caller gathers too
        if helpers > 0 and n > 0:
            with self._lock:
                # Fully claimed jobs are dropped here too, not only by a helper: a finished
                # job's future holds its batch, which must not stay referenced (a CPU slot
                # is reused only once nothing refers to it), also while no helper runs.
                self._next_job()
                self._jobs.append(job)
                if not self._helpers.stopping:
                    for _ in range(min(helpers, n) - len(self._helpers.threads)):
                        self._start_helper()
                self._cond.notify_all()
        return job

    def run(self, fn: Callable[[int], None], n: int, *, watch: Watch | None = None) -> None:
        job = self.submit(fn, n, watch=watch)
        try:
            job.wait()
        finally:
            job.cancel()  # only after an interrupt or a watch's error: a finished job ignores it

    def _start_helper(self) -> None:
        self._started += 1
        thread = threading.Thread(
            target=self._help, name=f"chunkstream-gather-{self._started}", daemon=True
        )
        try:
            self._helpers.threads.add(thread)
            thread.start()
        except BaseException:  # a signal handler's exception, say: no helper was started
            self._helpers.threads.discard(thread)
            raise

    def _help(self) -> None:
        helpers = self._helpers
        while True:
            with self._lock:
                job = None if helpers.stopping else self._next_job()
                if job is None and not helpers.stopping:
                    self._cond.wait(IDLE_S)
                    job = None if helpers.stopping else self._next_job()
                if job is None:
                    helpers.threads.discard(threading.current_thread())
                    return
            job.run_blocks()
            del job  # an idle helper must not keep a caller's arrays referenced

    def _next_job(self) -> Job | None:
        while self._jobs and self._jobs[0].claimed >= self._jobs[0].n:
            self._jobs.popleft()  # fully claimed: its caller waits for it, helpers need not
        return self._jobs[0] if self._jobs else None


class _Helpers:
    """A pool's helper threads, as its exit finalizer sees them (it must not hold the
    pool): the threads alive, and whether they are told to stop (under the pool's lock)."""

    __slots__ = ("cond", "lock", "stopping", "threads")

    def __init__(self, lock: threading.Lock, cond: threading.Condition) -> None:
        self.lock, self.cond = lock, cond
        self.stopping = False
        self.threads: set[threading.Thread] = set()


def _stop_helpers(helpers: _Helpers, timeout: float) -> None:
    """Tell the helpers to stop and join them, up to ``timeout`` s in all.

    Run at interpreter exit, before the interpreter starts finalizing: a helper
    still finishing a job then would drop the job's tensors after that, and a
    tensor made from a numpy array takes the GIL in its deleter, which a daemon
    thread of a finalizing interpreter cannot: the thread unwinds through torch's
    ``noexcept`` deleter and the process aborts ("terminate called without an
    active exception"). A helper's job is copies (bounded); one still running at
    ``timeout`` is left to the process.
    """
    deadline = time.monotonic() + timeout
    # Bounded: in a child forked while another thread held the lock, nobody releases it.
    if not helpers.lock.acquire(timeout=timeout):
        return
    try:
        helpers.stopping = True
        helpers.cond.notify_all()
        threads = list(helpers.threads)
    finally:
        helpers.lock.release()
    for thread in threads:
        if thread.ident is not None:  # else never started (a handler raised): no join
            thread.join(max(0.0, deadline - time.monotonic()))


def gather_pool(threads: int | None = None) -> GatherPool:
    """The process's default pool (``None`` or the default count), else a pool of its own.

    Made at import and never replaced, so no lock guards it; a pool starts its
    helpers on demand and they end when idle, so a pool of its own costs nothing
    once unused. (This was a registry of pools per count behind a lock of its own.)
    """
    threads = check_gather_threads(threads)
    return _DEFAULT if threads == _DEFAULT.threads else GatherPool(threads)


_DEFAULT = GatherPool(None)  # type: ignore[arg-type]  # no thread starts before a submit


# A block of windows per claim: small enough to balance, large enough that claiming
# costs nothing next to the copies.
_BLOCK_BYTES = 4 << 20


def as_numpy(tensor: torch.Tensor) -> np.ndarray | None:
    """A numpy view of a CPU tensor's memory, or ``None`` for a dtype numpy lacks.

    bfloat16 is viewed as int16: copies move bytes, they need no arithmetic.
    """
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy()
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):  # complex32 and the like
        return None


def gather_blocks(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], starts: list[int], window: int
) -> tuple[Callable[[int], None], int]:
    """``(fn, n)``: ``fn(k)`` for ``k`` in ``range(n)`` fills ``out[b] = src[s_b : s_b + window]``
    for every ``(src, out)`` of ``pairs`` (CPU tensors, ``out`` of shape ``(B, window, *rest)``).

    Where the dtypes differ the copy converts (numpy's cast, or torch's for a
    dtype numpy lacks).
    """
    work: list[tuple[Callable[[int, int], None], int, int]] = []  # (copy(lo, hi), lo, hi)
    for src_t, out_t in pairs:
        src, dst = as_numpy(src_t), as_numpy(out_t)
        mixed = src_t.dtype != out_t.dtype and torch.bfloat16 in (src_t.dtype, out_t.dtype)
        if src is None or dst is None or mixed:
            copy = partial(_torch_windows, src_t, out_t, starts, window)
        elif src.dtype == dst.dtype and src.dtype.itemsize in _BITS:
            bits = _BITS[src.dtype.itemsize]  # the same bytes, copied by a ufunc loop
            copy = partial(_bits_windows, src.view(bits), dst.view(bits), starts, window)
        else:
            copy = partial(_numpy_windows, src, dst, starts, window)
        row_bytes = out_t[0].numel() * out_t.element_size() if len(out_t) else 1
        per = max(1, _BLOCK_BYTES // max(1, row_bytes))
        work.extend((copy, lo, min(len(starts), lo + per)) for lo in range(0, len(starts), per))

    def fn(block: int) -> None:
        copy, lo, hi = work[block]
        copy(lo, hi)

    return fn, len(work)


# The loops over a block's windows are the gather's only per-window Python: kept to one
# slice and one assignment each (the assignment, a memcpy or a cast, releases the GIL).
def _numpy_windows(
    src: np.ndarray, dst: np.ndarray, starts: list[int], window: int, lo: int, hi: int
) -> None:
    for b in range(lo, hi):
        s = starts[b]
        dst[b] = src[s : s + window]


# A same-dtype window is copied as unsigned ints by ``np.positive`` (the identity on
# them, bit for bit, NaN payloads included), not by ``dst[b] = ...``: numpy's assignment
# is a memcpy, which glibc runs as ``rep movsb`` for a window of 2 KiB to 1 MiB, slower
# on AMD cores than the vector loop it uses above that, where the ufunc's loop is one.
_BITS = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.uint16),
    4: np.dtype(np.uint32),
    8: np.dtype(np.uint64),
}


def _bits_windows(
    src: np.ndarray, dst: np.ndarray, starts: list[int], window: int, lo: int, hi: int
) -> None:
    for b in range(lo, hi):
        s = starts[b]
        np.positive(src[s : s + window], out=dst[b])


def _torch_windows(
    src: torch.Tensor, dst: torch.Tensor, starts: list[int], window: int, lo: int, hi: int
) -> None:
    for b in range(lo, hi):
        s = starts[b]
        dst[b].copy_(src[s : s + window])


def host_gather(
    tensor: torch.Tensor,
    starts: list[int],
    window: int,
    out: torch.Tensor,
    *,
    pool: GatherPool | None = None,
) -> torch.Tensor:
    """``out[b] = tensor[starts[b] : starts[b] + window]`` on the host (:func:`gather_blocks`)."""
    pool = pool or gather_pool()
    pool.run(*gather_blocks([(tensor, out)], starts, window))
    return out


def host_copy_rows(
    dst: torch.Tensor,
    src: torch.Tensor,
    *,
    pool: GatherPool | None = None,
    watch: Watch | None = None,
) -> None:
    """``dst[:] = src`` (same shape, CPU), split in row blocks over the gather pool
    (``watch``: the wait's, :meth:`GatherPool.run`)."""
    pool = pool or gather_pool()
    a, b = as_numpy(dst), as_numpy(src)
    if a is None or b is None or dst.dtype != src.dtype:
        dst.copy_(src)
        return
    rows = len(a)
    if rows == 0:
        return
    per = max(1, _BLOCK_BYTES // max(1, a[:1].nbytes))
    blocks = -(-rows // per)

    def copy(block: int) -> None:
        a[block * per : (block + 1) * per] = b[block * per : (block + 1) * per]

    pool.run(copy, blocks, watch=watch)


def check_host_starts(starts: torch.Tensor, length: int, window: int) -> list[int]:
    """``starts`` as host ints, each a valid window start in a tensor of ``length`` rows."""
    values = starts.tolist()
    if values and (min(values) < 0 or max(values) > length - window):
        bad = next(v for v in values if not 0 <= v <= length - window)
        raise ConfigError.bad(
            "starts",
            f"a start {bad}",
            f"starts in [0, {length - window}] (window={window})",
            "Draw them with cs.sample_windows(chunk, ...) over this tensor.",
        )
    return values
