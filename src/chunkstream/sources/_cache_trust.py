"""Who a node-local cache folder (:mod:`._cache`) trusts: whoever may write it can change
what a training run reads, so the cache uses a folder only where nobody else may write.

A :class:`Trust` says who may write, and is checked on the folder ``DIR`` and on each
level the cache creates in it (``entries/``, every ``entries/<ab>/``, ``partial/``),
and on each entry file as it is read:

* **private** (the default): the folder is owned by the current user and nobody else
  may write it (no group or world write bit). The cache creates its folders ``0700``
  and its files ``0600``, whatever the umask.
* **group-shared** (``cache_group="lab"``, or ``CHUNKSTREAM_CACHE_GROUP`` beside
  ``CHUNKSTREAM_CACHE``): a deliberate choice to trust every member of one group. The
  folder belongs to that group (its owner the user, root or a member), carries the
  setgid bit so what is created in it keeps the group, and is never world-writable; it
  may be group-writable, for that group only. The cache creates its folders ``2770``
  and its files ``0660``. Any member can change what the others read: share a folder
  only with people whose runs you would let write your data.

The folders above ``DIR`` are not the cache's: ``/tmp`` and most scratch disks are
world-writable with the sticky bit, which keeps others from renaming or removing what
is not theirs, and that is enough. A parent that anyone may write *without* the sticky
bit is refused, since anyone could put their own folder in ``DIR``'s place after the
check; a group-writable parent is the group's business (and an entry file that is not
the user's, or the group's, is never served even then).

A folder that fails is not an error: the cache reads through, with one
:class:`~chunkstream.CacheWarning` saying what failed and how to fix it
(:meth:`Trust.fix`).
"""

from __future__ import annotations

import contextlib
import functools
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError

__all__ = ["CACHE_GROUP_ENV", "Trust", "cache_trust", "open_folder"]

#: The environment variable that names the group a ``$CHUNKSTREAM_CACHE`` folder is shared with.
CACHE_GROUP_ENV = "CHUNKSTREAM_CACHE_GROUP"


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


@functools.lru_cache(maxsize=256)  # asked on every hit of another member's entry
def _member(uid: int, gid: int) -> bool:
    """Whether user ``uid`` is in group ``gid`` (its primary group, or listed in it)."""
    try:
        user = pwd.getpwuid(uid)
        return user.pw_gid == gid or user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


@dataclass(frozen=True)
class Trust:
    """Who may write a cache folder: user ``uid`` only (``gid`` ``None``), or also the
    members of group ``gid`` (named ``group``). See the module docs for the rules."""

    uid: int
    gid: int | None = None
    group: str = ""

    @property
    def folder_mode(self) -> int:
        return 0o700 if self.gid is None else 0o2770

    @property
    def file_mode(self) -> int:
        return 0o600 if self.gid is None else 0o660

    def owner_problem(self, st: os.stat_result) -> str | None:
        """Why a file or folder with status ``st`` may be written by someone untrusted."""
        mode = st.st_mode
        if self.gid is None:
            if st.st_uid != self.uid:
                return f"is owned by {_user(st.st_uid)}, not by you ({_user(self.uid)})"
            if mode & (stat.S_IWGRP | stat.S_IWOTH):
                return f"may be written by others (mode {stat.filemode(mode)})"
            return None
        if mode & stat.S_IWOTH:
            return f"may be written by anyone (mode {stat.filemode(mode)})"
        if st.st_gid != self.gid and (st.st_uid != self.uid or mode & stat.S_IWGRP):
            return f"belongs to group {_group(st.st_gid)}, not {_group(self.gid)}"
        if st.st_uid not in (self.uid, 0) and not _member(st.st_uid, self.gid):
            return f"is owned by {_user(st.st_uid)}, who is not in group {self.group!r}"
        return None

    def folder_problem(self, path: str | Path, *, follow: bool = False) -> str | None:
        """Why folder ``path`` is not trusted (``None``: it is). Only ``DIR`` itself may be
        a symbolic link (``follow``); a link among the levels the cache makes is refused."""
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except OSError as exc:
            return f"cannot be checked ({exc.strerror})"
        if not stat.S_ISDIR(st.st_mode):
            return "is not a folder" if follow else "is not a folder (a link, or a file)"
        problem = self.owner_problem(st)
        if problem is None and self.gid is not None:
            if st.st_gid != self.gid:
                problem = f"belongs to group {_group(st.st_gid)}, not {_group(self.gid)}"
            elif not st.st_mode & stat.S_ISGID:
                problem = "lacks the setgid bit, so what is written in it would not keep the group"
        return problem

    def parent_problem(self, root: Path) -> str | None:
        """Why a parent of ``root`` lets others replace it: anyone may write it and it
        lacks the sticky bit (module docs)."""
        for parent in Path(os.path.realpath(root)).parents:
            with contextlib.suppress(OSError):
                mode = os.stat(parent).st_mode
                if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                    return (
                        f"its parent {str(parent)!r} may be written by anyone and lacks the "
                        f"sticky bit (mode {stat.filemode(mode)}), so anyone could put another "
                        "folder in its place"
                    )
        return None

    def make_folder(self, path: str | Path) -> bool:
        """Create folder ``path`` with :attr:`folder_mode` (whatever the umask); whether
        it was created here (``False``: it existed)."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return False
        if self.gid is not None:  # mkdir ignores the setgid bit, and a umask may drop g+w
            os.chown(path, -1, self.gid)
        os.chmod(path, self.folder_mode)
        return True

    def own(self, fd: int) -> None:
        """Give a file this process made :attr:`file_mode` (whatever the umask): in a
        shared folder the group writes it too (``partial`` files are taken over, the
        ledger counted up)."""
        if self.gid is not None:
            with contextlib.suppress(OSError):  # another member's file: theirs to set
                if os.fstat(fd).st_uid == self.uid:
                    os.fchmod(fd, self.file_mode)

    def fix(self, root: Path) -> str:
        """How to make the folder ``root`` trusted."""
        where = str(root)
        if self.gid is None:
            return (
                f"Remove it and let chunkstream create it (mode 700), or make it yours alone: "
                f"`chown -R $USER {where} && chmod -R go-w {where}`. To share one cache "
                f"with a group, pass cache_group= (or set {CACHE_GROUP_ENV})."
            )
        return (
            f"Let chunkstream create it, or give it to the group: `chgrp -R {self.group} "
            f"{where} && find {where} -type d -exec chmod 2770 {{}} +` (never world-writable)."
        )


def open_folder(trust: Trust, root: Path) -> tuple[str | None, int, set[str]]:
    """Make (or check) cache folder ``root``, its levels and its ledger: ``(what makes
    it untrusted or None, the ledger open read-write or -1, the entries/<ab> folders
    found)``. An ``OSError`` (the folder cannot be written) leaves nothing open."""
    for parent in reversed(root.parents):  # not the cache's: 755 (umask permitting)
        if not os.path.isdir(parent):
            with contextlib.suppress(FileExistsError):
                os.mkdir(parent, 0o755)
    trust.make_folder(root)
    problem = trust.folder_problem(root, follow=True) or trust.parent_problem(root)
    if problem is not None:
        return f"{str(root)!r} {problem}", -1, set()
    entries, partial = root / "entries", root / "partial"
    for level in (partial, entries):
        trust.make_folder(level)
        if (problem := trust.folder_problem(level)) is not None:
            return f"{str(level)!r} {problem}", -1, set()
    folders = set()
    with os.scandir(entries) as found:
        for folder in found:
            if (problem := trust.folder_problem(folder.path)) is not None:
                return f"{folder.path!r} {problem}", -1, set()
            folders.add(folder.path)
    flags = os.O_CREAT | os.O_NOFOLLOW
    ledger = os.open(root / "ledger", flags | os.O_RDWR, trust.file_mode)
    try:
        trust.own(ledger)
        if (problem := trust.owner_problem(os.fstat(ledger))) is not None:
            return f"{str(root / 'ledger')!r} {problem}", ledger, folders
        probe = partial / f".probe-{os.getpid()}"
        os.close(os.open(probe, flags | os.O_WRONLY, trust.file_mode))
        probe.unlink()
    except OSError:
        os.close(ledger)
        raise
    return None, ledger, folders


def cache_trust(cache_group: object, from_env: bool) -> Trust:
    """The :class:`Trust` of a cache folder: private, or shared with ``cache_group`` (a
    group name or id; ``None`` takes ``$CHUNKSTREAM_CACHE_GROUP`` where the folder came
    from ``$CHUNKSTREAM_CACHE``, ``from_env``). :class:`ConfigError` for a group that
    does not exist, or one this process is not in."""
    what = "cache_group"
    if cache_group is None and from_env:
        cache_group, what = os.environ.get(CACHE_GROUP_ENV) or None, CACHE_GROUP_ENV
    uid = os.geteuid()
    if cache_group is None:
        return Trust(uid)
    try:
        if isinstance(cache_group, bool) or not isinstance(cache_group, (str, int)):
            raise KeyError(cache_group)
        if isinstance(cache_group, int) or cache_group.isdigit():
            entry = grp.getgrgid(int(cache_group))
        else:
            entry = grp.getgrnam(cache_group)
    except KeyError:
        raise ConfigError.bad(
            what,
            cache_group,
            "the name or id of a group of this machine",
            "Name the group whose members share the cache folder (see `getent group`).",
        ) from None
    if entry.gr_gid != os.getegid() and entry.gr_gid not in os.getgroups():
        raise ConfigError.bad(
            what,
            cache_group,
            "a group this process is in (`id -Gn`)",
            "Join the group, or leave the cache private (no cache_group).",
        )
    return Trust(uid, entry.gr_gid, entry.gr_name)
