"""Who a node-local cache folder trusts (``sources/_cache_trust.py``) and entries bound to
their key (``sources/_cache_entry.py``), with real users: root and ``nobody``, the second
user's steps run with ``runuser -u nobody -- ...`` (skipped, with the reason, where this
process is not root or ``runuser`` is missing). The store is the one of issue 50: zarr v3,
8,192 x 16 float32 in chunks of 1,024 timesteps, served over local HTTP (tests/faults.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr

import chunkstream as cs
from chunkstream.sources._cache_entry import TRAILER_SIZE, trailer
from chunkstream.sources._remote import RemoteOptions
from tests.faults import Server, serve
from tests.test_cache import finish, start_worker

T, F, ZCHUNK = 8192, 16, 1024
N_CHUNKS = T // ZCHUNK
ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"chunkstream": RemoteOptions(timeout=20.0, retries=2, backoff=0.01)}
NOBODY = 65534
GROUP = "nogroup"  # nobody's primary group (gid 65534); root joins it with runuser -G


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Server, np.ndarray]]:
    root = tmp_path_factory.mktemp("trust-store")
    data = np.arange(T * F, dtype=np.float32).reshape(T, F)  # sums to 8,589,869,056
    zarr.create_array(
        root / "x.zarr", shape=data.shape, chunks=(ZCHUNK, F), dtype="f4", compressors=None
    )[:] = data
    for server in serve(root):
        yield server, data


@pytest.fixture
def server(served) -> Iterator[Server]:
    served[0].faults.paths.clear()
    yield served[0]
    served[0].faults.set("", "", 0)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder in /tmp both users may enter (pytest's tmp_path is its owner's alone)."""
    where = Path(tempfile.mkdtemp(prefix="chunkstream-trust-"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def lab_folder(shared_tmp: Path) -> Path:
    """A project folder of the group (root:nogroup, 2770), where either member may make
    the cache folder."""
    lab = shared_tmp / "lab"
    lab.mkdir()
    os.chown(lab, 0, NOBODY)
    lab.chmod(0o2770)
    return lab / "cache"


def chunk_gets(server: Server) -> int:
    return sum(n for p, n in server.faults.paths.items() if "/x.zarr/c/" in p)


def entry_files(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "entries").rglob("*") if p.is_file())


def chunk_entries(folder: Path) -> list[Path]:
    return [p for p in entry_files(folder) if p.stat().st_size == ZCHUNK * F * 4 + TRAILER_SIZE]


def read_here(url: str, folder: Path, **kwargs) -> tuple[np.ndarray, cs.ZarrSource]:
    with cs.ZarrSource(url, cache=folder, storage_options=OPTIONS, **kwargs) as source:
        out = {"data": np.empty((T, F), np.float32)}
        source.read_into(0, T, out)
    return out["data"], source


def second_user(*, python: bool = True) -> None:
    """Skip unless this process can run commands as ``nobody``; with ``python``, commands
    that import chunkstream (``nobody`` cannot where the interpreter lies in a folder only
    root may enter, such as ``/root/.pyenv``: the tests where ``nobody`` only runs shell
    commands need no more than ``runuser``)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as a second user (nobody) with runuser")
    if shutil.which("runuser") is None:
        pytest.skip("runuser is missing: no second user to act as")
    if not python:
        return
    probe = as_user(["nobody"], [sys.executable, "-c", "import chunkstream, tests.faults"])
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot import chunkstream from {ROOT}: {probe.stderr[-300:]}")


def as_user(who: list[str], command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``command`` run by ``runuser -u who[0]`` (``who[1:]``: more runuser options)."""
    env = ["env", f"PYTHONPATH={ROOT / 'src'}:{ROOT}"]
    return subprocess.run(
        ["runuser", "-u", *who, "--", *env, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def worker(url: str, folder: Path, *args: str, who: list[str] | None = None) -> subprocess.Popen:
    return start_worker(url, folder, "-", *args, who=who)


def true_sha(data: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(data.tobytes()).hexdigest()


# -- issue 50's four steps, with two real users ------------------------------------------


def test_a_folder_another_user_made_is_read_through_never_swapped(server, served, shared_tmp):
    """1. nobody makes the cache folder, its levels and the 256 ``entries/<ab>`` folders,
    all 777; 2. the victim (root) reads an epoch with ``CHUNKSTREAM_CACHE`` there;
    3. nobody plants entries under the victim's very names, each a valid entry (trailer,
    key) holding another chunk's bytes, with ``cp B A.x; mv -f A.x A``; 4. the victim's
    next epoch. Both epochs are the store's bytes, read through with one warning each."""
    second_user(python=False)
    url, data = f"{server.url}/x.zarr", served[1]
    script = (
        "d=$(mktemp -d /tmp/pcache.XXXX) && mkdir -m 777 $d/entries $d/partial && "
        "for i in $(seq 0 255); do mkdir -m 777 $d/entries/$(printf %02x $i); done && "
        "chmod 777 $d && echo $d"
    )
    made = as_user(["nobody"], ["sh", "-c", script])
    assert made.returncode == 0, made.stderr
    folder = Path(made.stdout.strip())
    try:
        assert folder.stat().st_uid == NOBODY
        first = finish(worker(url, folder, "--from-env"))  # step 2
        assert first["sha256"] == true_sha(data) and first["sum"] == 8_589_869_056
        assert len(first["warnings"]) == 1, first["warnings"]
        said = first["warnings"][0]
        assert "is not trusted" in said and "is owned by nobody" in said and "chown" in said
        assert entry_files(folder) == [] and first["hits"] == 0  # wrote and read nothing
        # the victim's names, as its own trusted cache files them
        own = shared_tmp / "own"
        read_here(url, own)
        genuine = chunk_entries(own)
        assert len(genuine) == N_CHUNKS
        stage = shared_tmp / "stage"
        stage.mkdir()
        for i, path in enumerate(genuine):  # entry i holds chunk i+1's bytes, sealed as i
            other = genuine[(i + 1) % len(genuine)].read_bytes()[:-TRAILER_SIZE]
            (stage / path.name).write_bytes(other + trailer(path.name, other))
        stage.chmod(0o755)
        plant = " && ".join(
            f"cp {stage / p.name} {folder}/entries/{p.parent.name}/{p.name}.x "
            f"&& mv -f {folder}/entries/{p.parent.name}/{p.name}.x "
            f"{folder}/entries/{p.parent.name}/{p.name}"
            for p in genuine
        )
        done = as_user(["nobody"], ["sh", "-c", plant])  # step 3
        assert done.returncode == 0, done.stderr
        assert len(chunk_entries(folder)) == N_CHUNKS
        second = finish(worker(url, folder, "--from-env"))  # step 4
        assert second["sha256"] == true_sha(data) and second["sum"] == 8_589_869_056
        assert len(second["warnings"]) == 1 and "is not trusted" in second["warnings"][0]
        assert second["hits"] == 0 and second["misses"] == first["misses"]  # read through
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_level_another_user_made_in_a_trusted_folder_is_refused(server, served, shared_tmp):
    second_user(python=False)
    url, folder = f"{server.url}/x.zarr", shared_tmp / "cache"
    read_here(url, folder)
    made = as_user(["nobody"], ["mkdir", "-m", "777", str(folder / "entries" / "zz")])
    assert made.returncode != 0  # the levels the cache made are the user's alone
    os.mkdir(folder / "entries" / "zz")
    os.chown(folder / "entries" / "zz", NOBODY, NOBODY)  # as if left from before
    with pytest.warns(cs.CacheWarning, match=r"not trusted: '.*/entries/zz' is owned by nobody"):
        got, source = read_here(url, folder)
    np.testing.assert_array_equal(got, served[1])
    assert not source.cache.active and source.cache.counters.hits == 0


def test_an_entry_file_another_user_owns_is_dropped_not_served(server, served, shared_tmp):
    """A valid-looking entry (its trailer and key right, another chunk's bytes) that
    nobody owns, left in a folder that passes: dropped and fetched again."""
    second_user(python=False)
    url, folder = f"{server.url}/x.zarr", shared_tmp / "cache"
    read_here(url, folder)
    a, b = chunk_entries(folder)[:2]
    other = b.read_bytes()[:-TRAILER_SIZE]
    a.write_bytes(other + trailer(a.name, other))
    os.chown(a, NOBODY, NOBODY)
    a.chmod(0o666)
    with pytest.warns(cs.CacheWarning, match=rf"entry {a} is owned by nobody.*dropped"):
        got, source = read_here(url, folder)
    np.testing.assert_array_equal(got, served[1])
    assert source.cache.counters.misses == 1 and source.cache.counters.hits == N_CHUNKS - 1


# -- group-shared folders -------------------------------------------------------------------


def test_a_group_shared_folder_works_for_two_users_of_the_group(server, served, shared_tmp):
    second_user()
    server.faults.set("/x.zarr/c/", "slow", times=None)  # the two fetch at once
    url, folder = f"{server.url}/x.zarr", lab_folder(shared_tmp)
    users = [["root", "-G", GROUP], ["nobody"]]
    workers = [
        worker(url, folder, "--cache-group", GROUP, *(["--reverse"] * i), who=who)
        for i, who in enumerate(users)
    ]
    results = [finish(w) for w in workers]
    for result in results:
        assert result["sha256"] == true_sha(served[1]) and result["warnings"] == []
    assert sum(r["misses"] for r in results) == N_CHUNKS  # each object fetched once,
    assert chunk_gets(server) == N_CHUNKS  # by one user or the other: each served the other
    gid = folder.stat().st_gid
    assert gid == NOBODY
    for path in [folder, *folder.rglob("*")]:  # the folder and all in it: the group's
        st = path.stat()
        assert st.st_gid == gid and not st.st_mode & stat.S_IWOTH, path
        if path.is_dir():
            assert stat.S_IMODE(st.st_mode) == 0o2770, path
    # a third read, by nobody: every entry from the folder, whoever wrote it
    third = finish(worker(url, folder, "--cache-group", GROUP, who=["nobody"]))
    assert third["misses"] == 0 and third["warnings"] == []
    assert third["hits"] == results[0]["hits"] + results[0]["misses"]  # every read


def test_a_world_writable_group_folder_is_refused(server, served, shared_tmp):
    second_user()
    url, folder = f"{server.url}/x.zarr", lab_folder(shared_tmp)
    finish(worker(url, folder, "--cache-group", GROUP, who=["nobody"]))
    folder.chmod(0o2777)
    result = finish(worker(url, folder, "--cache-group", GROUP, "--from-env", who=["nobody"]))
    assert result["sha256"] == true_sha(served[1])
    assert len(result["warnings"]) == 1, result["warnings"]
    assert "may be written by anyone" in result["warnings"][0]
    assert "chgrp -R nogroup" in result["warnings"][0]
    assert result["hits"] == 0 and result["misses"] > N_CHUNKS  # read through, every read


# -- one user: key binding, modes, parents, bad input, bench --------------------------------


def test_an_entry_copied_under_another_name_is_fetched_again(server, served, tmp_path):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    read_here(url, folder)
    a, b = chunk_entries(folder)[:2]
    shutil.copyfile(b, a)  # a restore gone wrong, or a hand: valid bytes, another name
    before = chunk_gets(server)
    with pytest.warns(cs.CacheWarning, match=rf"entry {a} holds the entry {b.name}, not "):
        got, source = read_here(url, folder)
    np.testing.assert_array_equal(got, served[1])
    assert chunk_gets(server) == before + 1  # that object, fetched again
    assert source.cache.counters.misses == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", cs.CacheWarning)
        np.testing.assert_array_equal(read_here(url, folder)[0], served[1])  # mended


def test_entries_of_the_format_without_a_key_are_fetched_again_with_one_warning(
    server, served, tmp_path
):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    read_here(url, folder)
    import struct

    from chunkstream.sources._shards import crc32c

    for path in entry_files(folder):  # as the version before issue 50 wrote them
        data = path.read_bytes()[:-TRAILER_SIZE]
        path.write_bytes(data + struct.pack("<4sIQ", b"CSC1", crc32c(data), len(data)))
    before = chunk_gets(server)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, source = read_here(url, folder)
    np.testing.assert_array_equal(got, served[1])
    said = [str(w.message) for w in caught if issubclass(w.category, cs.CacheWarning)]
    assert len(said) == 1 and "older chunkstream, without its key" in said[0], said
    assert chunk_gets(server) == before + N_CHUNKS and source.cache.counters.hits == 0
    assert source.cache.active  # the folder is fine: the new entries replace the old
    assert read_here(url, folder)[1].cache.counters.hits == N_CHUNKS


def test_the_cache_makes_its_folders_0700_and_its_files_0600(server, tmp_path):
    url, folder = f"{server.url}/x.zarr", tmp_path / "a" / "cache"
    old = os.umask(0)  # the modes do not depend on the umask
    try:
        read_here(url, folder)
    finally:
        os.umask(old)
    for path in [folder, *folder.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == want, path


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_folder_others_may_write_is_read_through_with_one_warning(server, served, tmp_path, mode):
    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    read_here(url, folder)  # a working cache, entries in place
    (folder / "partial").chmod(mode)
    before = chunk_gets(server)
    with pytest.warns(cs.CacheWarning, match=r"is not trusted: .*/partial' may be written by ot"):
        got, source = read_here(url, folder)
    np.testing.assert_array_equal(got, served[1])
    assert chunk_gets(server) == before + N_CHUNKS and source.cache.counters.hits == 0


def test_a_parent_anyone_may_write_without_the_sticky_bit_is_refused(server, served, tmp_path):
    url, parent = f"{server.url}/x.zarr", tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.warns(cs.CacheWarning, match=r"its parent .*/open' may be written by anyone"):
        got, _ = read_here(url, parent / "cache")
    np.testing.assert_array_equal(got, served[1])
    parent.chmod(0o1777)  # /tmp's mode: others cannot rename what is not theirs
    with warnings.catch_warnings():
        warnings.simplefilter("error", cs.CacheWarning)
        assert read_here(url, parent / "cache")[1].cache.active


def test_bad_cache_group_names_the_parameter_and_the_fix(server, tmp_path, monkeypatch):
    url = f"{server.url}/x.zarr"
    with pytest.raises(cs.ConfigError, match=r"cache_group='no-such-group-x' .*getent group"):
        cs.ZarrSource(url, cache=tmp_path / "c", cache_group="no-such-group-x")
    with pytest.raises(cs.ConfigError, match=r"cache_group='lab' .*Pass cache=DIR"):
        cs.ZarrSource(url, cache_group="lab")
    outside = next((g for g in (GROUP, "daemon", "sys") if _not_mine(g)), None)
    if outside is not None:
        with pytest.raises(cs.ConfigError, match=rf"cache_group='{outside}' .*a group this pro"):
            cs.ZarrSource(url, cache=tmp_path / "c", cache_group=outside)
    monkeypatch.setenv("CHUNKSTREAM_CACHE", str(tmp_path / "env"))
    monkeypatch.setenv("CHUNKSTREAM_CACHE_GROUP", "no-such-group-x")
    with pytest.raises(cs.ConfigError, match=r"CHUNKSTREAM_CACHE_GROUP='no-such-group-x'"):
        cs.ZarrSource(url, storage_options=OPTIONS)


def _not_mine(name: str) -> bool:
    import grp

    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return False
    return gid != os.getegid() and gid not in os.getgroups()


def test_bench_reports_a_cache_folder_it_does_not_trust(server, tmp_path, capsys):
    from chunkstream.cli import main

    url, folder = f"{server.url}/x.zarr", tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)
    args = [
        "bench",
        url,
        "--cache",
        str(folder),
        "--chunk-size",
        "1024",
        "--chunks",
        "2",
        "--prefetch",
        "1",
        "--workers",
        "1",
        "--train-ms",
        "0",
        "--device",
        "cpu",
        "--no-progress",
    ]
    with pytest.warns(cs.CacheWarning, match="is not trusted"):
        assert main([*args, "--json"]) == 0
    cached = json.loads(capsys.readouterr().out)["cache"]
    assert len(cached["warnings"]) == 1 and "is not trusted" in cached["warnings"][0]
    assert cached["hits"] == [0, 0] and cached["misses"][1] > 0  # read through, both epochs
    with pytest.warns(cs.CacheWarning, match="is not trusted"):
        assert main(args) == 0
    text = capsys.readouterr().out
    assert f"cache warning: chunkstream cache {str(folder)!r} is not trusted" in text
