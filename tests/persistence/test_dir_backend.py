"""Directory backend specifics: URLs, layout, atomic files, locking."""

from __future__ import annotations

import contextlib
import json
import os
import threading

import pytest

from flowengine import states
from flowengine.persistence import backends, models
from flowengine.persistence.backends import impl_dir

#: Bound on joining the writer threads (fails instead of hanging).
JOIN_TIMEOUT_S = 30.0


def _book():
    book = models.LogBook("book")
    fd = models.FlowDetail("flow", models.generate_uuid())
    fd.add(models.TaskDetail("t", models.generate_uuid()))
    book.add(fd)
    return book


@pytest.mark.parametrize(
    "conf",
    [
        "dir://{p}",
        "file://{p}",
        {"connection": "dir", "path": "{p}"},
        {"connection": "file:///ignored", "path": "{p}"},
    ],
)
def test_urls_and_conf_select_the_path(tmp_path, conf):
    path = str(tmp_path / "store")
    conf = (
        conf.format(p=path)
        if isinstance(conf, str)
        else {k: v.format(p=path) for k, v in conf.items()}
    )
    be = backends.fetch(conf)
    assert isinstance(be, impl_dir.DirBackend) and be.base_path == path


def test_no_path_is_a_value_error():
    with pytest.raises(ValueError, match="needs a path"):
        backends.fetch({"connection": "dir"})


def test_layout_is_json_files_and_relative_links(tmp_path):
    be = backends.fetch(f"dir://{tmp_path}/s")
    book = _book()
    fd = next(iter(book))
    ad = next(iter(fd))
    with contextlib.closing(be.get_connection()) as conn:
        conn.save_logbook(book)
    base = be.base_path
    with open(os.path.join(base, "atom_details", ad.uuid, "metadata")) as fp:
        stored = json.load(fp)
    assert stored["type"] == "TASK_DETAIL" and stored["atom"]["name"] == "t"
    link = os.path.join(base, "flow_details", fd.uuid, ad.uuid)
    assert os.readlink(link) == os.path.join("..", "..", "atom_details", ad.uuid)
    assert os.path.isdir(os.path.join(base, "books", book.uuid, fd.uuid))
    # No temporary files are left behind by atomic writes.
    leftovers = [f for _, _, files in os.walk(base) for f in files if f.endswith(".tmp")]
    assert leftovers == []


def test_half_created_book_is_skipped_when_listing(tmp_path):
    be = backends.fetch(f"dir://{tmp_path}/s")
    with contextlib.closing(be.get_connection()) as conn:
        book = _book()
        conn.save_logbook(book)
        # A writer killed between mkdir and its first write leaves an empty dir.
        os.makedirs(os.path.join(be.base_path, "books", "half-made"))
        assert [b.uuid for b in conn.get_logbooks()] == [book.uuid]


def test_threads_with_own_connections_never_see_partial_files(tmp_path):
    # Given one stored atom, rewritten over and over by four writer threads
    be = backends.fetch(f"dir://{tmp_path}/s?fsync=false")
    book = _book()
    ad = next(iter(next(iter(book))))
    with contextlib.closing(be.get_connection()) as conn:
        conn.save_logbook(book)
    errors = []
    rounds = 40

    def writer(n):
        with contextlib.closing(be.get_connection()) as conn:
            mine = ad.copy()
            for i in range(rounds):
                mine.put(states.SUCCESS, {"writer": n, "i": i, "pad": "x" * 4096})
                conn.update_atom_details(mine)

    def reader():
        with contextlib.closing(be.get_connection()) as conn:
            for _ in range(rounds * 2):
                try:
                    got = conn.get_atom_details(ad.uuid)
                    assert got.results is None or len(got.results["pad"]) == 4096
                except Exception as e:  # reported below
                    errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    # Then every read saw a whole record and the last write is a complete one
    assert errors == [] and not any(t.is_alive() for t in threads)
    with contextlib.closing(be.get_connection()) as conn:
        final = conn.get_atom_details(ad.uuid).results
    assert final["i"] == rounds - 1 and len(final["pad"]) == 4096


def test_max_cache_size_bounds_the_file_cache_and_reads_stay_fresh(tmp_path):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_cache_size"):
            impl_dir.DirBackend({"path": str(tmp_path), "max_cache_size": bad})
    backend = impl_dir.DirBackend({"path": str(tmp_path), "max_cache_size": 2})
    with backend.get_connection() as conn:
        books = [models.LogBook(f"b{i}") for i in range(5)]
        for book in books:
            conn.save_logbook(book)
            assert conn.get_logbook(book.uuid).name == book.name
            assert backend.file_cache.currsize <= 2
        # A write by another backend (another process) is seen, not a stale copy.
        other = impl_dir.DirBackend({"path": str(tmp_path)})
        with other.get_connection() as conn2:
            changed = conn2.get_logbook(books[-1].uuid)
            changed.meta = {"changed": True}
            conn2.save_logbook(changed)
        assert conn.get_logbook(books[-1].uuid).meta == {"changed": True}
