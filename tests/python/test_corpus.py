"""`headwater preprocess --corpus`: a manifest of sources into one output
root — every good source built (bytes identical to a lone `preprocess`),
the broken ones reported with their errors and the rest finished, a rerun
skipping what is done, shards whose union is the corpus, bad manifests
refused before any work, and the corpus manifest opened as a mixture; the
same corpus built as Ray tasks on a two-node local cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TIME_SCHEMA, write_text

import headwater
from headwater.cli import main
from headwater.mixture import open_sampler
from headwater.preprocessing.corpus import (
    parse_shard,
    preprocess_corpus,
    read_corpus,
    shard_of,
)

SMALL = {"default_batch_size": 4, "default_sequence_length": 64, "num_threads": 1}


def _corpus(root: Path, make_sqlite: Callable[[Path], Path]) -> Path:
    src = root / "src"
    src.mkdir()
    first = make_sqlite(src / "shop.sqlite")
    for name in ("store", "market"):
        shutil.copy(first, src / f"{name}.sqlite")
    (src / "empty.sqlite").write_bytes(b"")  # broken: not a database
    write_text(root / "time.toml", TIME_SCHEMA)
    entries = [
        '[[source]]\npath = "src/shop.sqlite"\nschema = "time.toml"\nweight = 2',
        '[[source]]\npath = "src/store.sqlite"\nschema = "time.toml"',
        '[[source]]\npath = "src/empty.sqlite"',
        '[[source]]\npath = "src/market.sqlite"\nname = "bazaar"\nschema = "time.toml"',
    ]
    manifest = root / "corpus.toml"
    manifest.write_text('[defaults]\nembedder = "hash"\n\n' + "\n\n".join(entries) + "\n")
    return manifest


def _bytes(db: Path) -> dict[str, bytes]:
    return {str(p.relative_to(db)): p.read_bytes() for p in sorted(db.rglob("*")) if p.is_file()}


def test_a_corpus_builds_reports_skips_and_opens_as_a_mixture(
    tmp_path: Path, make_sqlite: Callable[[Path], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = _corpus(tmp_path, make_sqlite)
    out = tmp_path / "out"
    assert main(["preprocess", "--corpus", str(manifest), str(out)]) == 1  # one failed
    table = capsys.readouterr().out
    assert "3 done, 0 skipped (up to date), 1 failed" in table, table
    report = json.loads((out / ".corpus" / "report.json").read_text())
    status = {s["name"]: s["status"] for s in report["sources"]}
    assert status == {"shop": "done", "store": "done", "empty": "failed", "bazaar": "done"}
    failed = next(s for s in report["sources"] if s["name"] == "empty")
    assert "empty" in failed["error"] and "0 bytes" in failed["error"], failed
    assert not (out / "empty").exists() and not (out / "empty.partial").exists()
    # Each source built says what it took, phase by phase.
    shop = next(s for s in report["sources"] if s["name"] == "shop")
    assert [p["phase"] for p in shop["phases"]] == [
        "keys", "tables", "tasks", "embeddings", "graph and write"
    ]
    assert all(p["seconds"] > 0 and p["peak_rss_bytes"] > 0 for p in shop["phases"])
    assert shop["peak_rss_bytes"] == max(p["peak_rss_bytes"] for p in shop["phases"])
    assert "peak MiB" in table.splitlines()[0]
    assert f"{shop['peak_rss_bytes'] / 2**20:.0f}" in next(
        line for line in table.splitlines() if line.startswith("shop ")
    )
    # Byte-identical to a lone preprocess of the same source.
    alone = tmp_path / "alone"
    headwater.preprocess(tmp_path / "src" / "store.sqlite", alone, schema=tmp_path / "time.toml",
                         embedder="hash", progress=False)
    assert _bytes(out / "store") == _bytes(alone)
    # The corpus manifest is a mixture of the databases that are done.
    with open_sampler(out / "corpus.toml", **SMALL) as s:
        meta = s.database_metadata()
        s.next_train_batch()
    assert [d["name"] for d in meta["databases"]] == ["shop", "store", "bazaar"]
    assert [d["share"] for d in meta["databases"]] == [0.5, 0.25, 0.25]
    # A rerun skips what is done; the fixed source is then built.
    before = (out / "shop" / "metadata.json").stat().st_mtime_ns
    shutil.copy(tmp_path / "src" / "shop.sqlite", tmp_path / "src" / "empty.sqlite")
    r = preprocess_corpus(manifest, out, progress=False)
    assert r["counts"] == {"done": 1, "skipped": 3, "failed": 0, "not_run": 0}
    assert (out / "shop" / "metadata.json").stat().st_mtime_ns == before
    # A changed source is rebuilt.
    (tmp_path / "time.toml").write_text(TIME_SCHEMA + "\n")
    r = preprocess_corpus(manifest, out, progress=False)
    assert r["counts"]["done"] == 3 and r["counts"]["skipped"] == 1  # empty has no schema


def test_fail_fast_stops_at_the_first_failure(
    tmp_path: Path, make_sqlite: Callable[[Path], Path]
) -> None:
    manifest = _corpus(tmp_path, make_sqlite)
    r = preprocess_corpus(manifest, tmp_path / "out", fail_fast=True, progress=False)
    assert [s["status"] for s in r["sources"]] == ["done", "done", "failed", "not_run"]


def test_shards_deal_every_source_once_balanced_by_size(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i, size in enumerate([50, 40, 30, 20, 10, 10, 5]):
        (src / f"s{i}.sqlite").write_bytes(b"x" * size)
    sources = read_corpus(src)
    for n in range(1, 5):
        shards = [shard_of(sources, (i, n)) for i in range(n)]
        names = [s.name for sh in shards for s in sh]
        assert sorted(names) == sorted(s.name for s in sources) and len(set(names)) == len(names)
        loads = [sum(s.size() for s in sh) for sh in shards]
        assert max(loads) - min(loads) <= 50, (n, loads)
    assert parse_shard("1/4") == (1, 4)
    for bad in ("3/2", "4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_bad_manifests_are_refused_naming_the_entry(tmp_path: Path) -> None:
    (tmp_path / "a.sqlite").write_bytes(b"x")

    def refused(text: str, match: str, exc: type[Exception] = ValueError) -> None:
        m = tmp_path / "m.toml"
        m.write_text(text)
        with pytest.raises(exc, match=match):
            read_corpus(m)

    refused('[[source]]\npath = "nope.sqlite"', r"\[\[source\]\] #1: source 'nope.sqlite' not found",
            FileNotFoundError)
    refused('[[source]]\npath = "a.sqlite"\n[[source]]\npath = "a.sqlite"',
            "two sources have the output name 'a'")
    refused('[[source]]\npath = "a.sqlite"\nname = "../up"', r"#1: output name '../up'")
    refused('[[source]]\npath = "a.sqlite"\nname = "/abs"', r"#1: output name '/abs'")
    refused('[[source]]\npath = "a.sqlite"\nwieght = 2',
            r"unknown key\(s\) \['wieght'\] \(did you mean `weight`\?\)")
    refused('[[source]]\npath = "a.sqlite"\nschema = "s.toml"', "schema 's.toml' not found",
            FileNotFoundError)
    refused('[defaults]\nembeder = "hash"\n[[source]]\npath = "a.sqlite"',
            r"\[defaults\]: unknown key\(s\) \['embeder'\] \(did you mean `embedder`\?\)")
    refused('[[sources]]\npath = "a.sqlite"', r"\['sources'\] \(did you mean `source`\?\)")
    assert main(["preprocess", "--shard", "0/2", str(tmp_path / "a.sqlite"), str(tmp_path / "o")]) == 2


def _in_own_network(cmd: list[str]) -> list[str]:
    """``cmd`` in a network namespace with only loopback where this user
    may make one (root), so the servers it starts are reachable from this
    host only; ``cmd`` itself elsewhere."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None or shutil.which("ip") is None:
        return cmd
    wrap = [unshare, "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    if subprocess.run([*wrap, "true"], capture_output=True, check=False).returncode != 0:
        return cmd  # a container that may not make namespaces
    return [*wrap, *cmd]


def test_a_corpus_on_ray_clusters_matches_the_sequential_build(
    tmp_path: Path, make_sqlite: Callable[[Path], Path]
) -> None:
    pytest.importorskip("ray")
    manifest = _corpus(tmp_path, make_sqlite)
    seq = preprocess_corpus(manifest, tmp_path / "seq", progress=False)
    out = tmp_path / "ray"
    script = Path(__file__).with_name("ray_corpus.py")
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # Ray's socket paths stay short
    try:
        cmd = _in_own_network([sys.executable, str(script), str(manifest), str(out)])
        env = {**os.environ, "RAY_TMPDIR": str(temp)}
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    reports = json.loads(r.stdout.splitlines()[-1])
    first, again = reports["first"], reports["again"]
    # Every source ran as a task on a cluster of two nodes, both of them used.
    assert first["engine"] == "ray" and first["nodes"] == 2 and first["resources"]["CPU"] == 2
    status = {s["name"]: s["status"] for s in first["sources"]}
    assert status == {"shop": "done", "store": "done", "empty": "failed", "bazaar": "done"}
    assert len({s["node"] for s in first["sources"]}) == 2, first["sources"]
    # The broken source is named with the sequential path's error; every
    # good database is byte-identical to the sequential build's.
    errors = {s["name"]: s.get("error") for s in seq["sources"]}
    assert [s["error"] for s in first["sources"] if s["status"] == "failed"] == [errors["empty"]]
    for name in ("shop", "store", "bazaar"):
        assert _bytes(out / name) == _bytes(tmp_path / "seq" / name), name
    assert (out / "corpus.toml").read_text() == (tmp_path / "seq" / "corpus.toml").read_text()
    # A rerun builds nothing that is done (the broken source is tried again).
    assert again["counts"] == {"done": 0, "skipped": 3, "failed": 1, "not_run": 0}
    # `--ray` without an address: a local instance, the same databases.
    local = reports["local"]
    assert local["engine"] == "ray" and local["nodes"] == 1, local
    assert local["counts"] == {"done": 3, "skipped": 0, "failed": 1, "not_run": 0}
    assert all(_bytes(tmp_path / "ray_local" / n) == _bytes(out / n) for n in status if n != "empty")
    # The progress lines name each source as its task finishes.
    assert "ray: 2 node(s), 2 CPUs; 4 source(s) to build" in r.stderr, r.stderr[-3000:]
    assert re.search(r"\[\d/4\] bazaar: done in", r.stderr), r.stderr[-3000:]


def test_a_ray_task_asks_for_its_sources_memory_limit(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from headwater.preprocessing.corpus_ray import _options

    (tmp_path / "a.sqlite").write_bytes(b"")
    (tmp_path / "c.toml").write_text(
        '[[source]]\npath = "a.sqlite"\nmemory_limit = "256MiB"\n\n'
        '[[source]]\npath = "a.sqlite"\nname = "b"\n'
    )
    big, small = read_corpus(tmp_path / "c.toml")
    assert _options(big) == {"name": "preprocess:a", "num_cpus": 1, "max_retries": 0,
                             "scheduling_strategy": "SPREAD", "memory": 256 << 20}
    assert "memory" not in _options(small)


@pytest.mark.parametrize(
    ("address", "match"),
    [
        ("127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:99999", "expected HOST:PORT"),
        ("127.0.0.1:{port}", "127.0.0.1:[0-9]+: no Ray cluster answers there"),
    ],
)
def test_a_ray_address_that_does_not_answer_is_refused_before_any_work(
    tmp_path: Path, make_sqlite: Callable[[Path], Path], address: str, match: str
) -> None:
    pytest.importorskip("ray")
    from conftest import free_port

    manifest = _corpus(tmp_path, make_sqlite)
    with pytest.raises(ValueError, match=match):
        preprocess_corpus(manifest, tmp_path / "out", progress=False,
                          ray_address=address.format(port=free_port()))
    assert not (tmp_path / "out" / "shop").exists()


def test_the_generated_corpus_varies_its_schemas_and_breaks_three_sources(tmp_path: Path) -> None:
    from headwater.data.corpus import generate_corpus

    manifest = generate_corpus(tmp_path / "a", sources=8, rows=60, broken=3, seed=5)
    again = generate_corpus(tmp_path / "b", sources=8, rows=60, broken=3, seed=5)
    files = sorted(p.name for p in (tmp_path / "a" / "sources").iterdir())
    assert all(
        (tmp_path / "a" / "sources" / f).read_bytes() == (tmp_path / "b" / "sources" / f).read_bytes()
        for f in files
    ) and manifest.read_text() == again.read_text()
    r = preprocess_corpus(manifest, tmp_path / "out", progress=False)
    assert r["counts"] == {"done": 5, "skipped": 0, "failed": 3, "not_run": 0}
    errors = sorted(s["error"] for s in r["sources"] if s["status"] == "failed")
    assert "the file is empty (0 bytes)" in errors[0], errors
    assert "not a RelBench folder" in errors[1], errors
    assert "references table `shops`, which is not in the source" in errors[2], errors
    done = [json.loads((tmp_path / "out" / s["name"] / "metadata.json").read_text())
            for s in r["sources"] if s["status"] == "done"]
    assert len({len(m["tables"]) for m in done}) > 1  # not one schema five times
    with open_sampler(tmp_path / "out" / "corpus.toml", **SMALL) as s:
        assert len(s.database_metadata()["databases"]) == 5
        s.next_train_batch()


@pytest.mark.slow
def test_a_hundred_sources_on_ray_match_the_sequential_build(tmp_path: Path) -> None:
    """The scale run: 100 generated sources (3 broken) built one after
    another, then on a local Ray instance of this host's CPUs; prints both
    wall times (the figure for the docs), checks every database byte for
    byte."""
    pytest.importorskip("ray")
    import time

    from headwater.data.corpus import generate_corpus

    manifest = generate_corpus(tmp_path / "c", sources=100, rows=2000, broken=3, seed=0)
    t0 = time.perf_counter()
    seq = preprocess_corpus(manifest, tmp_path / "seq", progress=False)
    t1 = time.perf_counter()
    script = Path(__file__).with_name("ray_corpus.py")
    cmd = [sys.executable, str(script), str(manifest), str(tmp_path / "ray"), "--local-only"]
    r = subprocess.run(_in_own_network(cmd), capture_output=True, text=True, timeout=3600,
                       check=False)
    assert r.returncode == 0, r.stderr[-5000:]
    ray_report = json.loads(r.stdout.splitlines()[-1])["local"]
    print(f"\n100 sources: sequential {t1 - t0:.1f} s, local Ray {ray_report['seconds']:.1f} s "
          f"({ray_report['resources']['CPU']:g} CPUs): {ray_report['seconds'] / (t1 - t0):.2f}x")
    assert seq["counts"] == ray_report["counts"] == {"done": 97, "skipped": 0, "failed": 3,
                                                     "not_run": 0}
    for s in seq["sources"]:
        if s["status"] == "done":
            assert _bytes(tmp_path / "ray_local" / s["name"]) == _bytes(tmp_path / "seq" / s["name"])


def _pids_using(marker: str) -> list[int]:
    """Processes whose command line or environment mentions ``marker``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            text = (d / "cmdline").read_bytes() + (d / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in text:
            found.append(int(d.name))
    return found


def test_a_ray_run_killed_midway_resumes_to_the_sequential_corpus(
    tmp_path: Path, make_sqlite: Callable[[Path], Path]
) -> None:
    """SIGKILL to a `--ray` build (the driver and the Ray instance it
    started, as a preempted node loses them) once its first source is done;
    the rerun skips what was done, builds the rest, and every database and
    the corpus manifest are the sequential build's, byte for byte."""
    pytest.importorskip("ray")
    import signal
    import threading

    src = tmp_path / "src"
    src.mkdir()
    names = [f"s{i:02d}" for i in range(12)]
    make_sqlite(src / f"{names[0]}.sqlite")
    for name in names[1:]:
        shutil.copy(src / f"{names[0]}.sqlite", src / f"{name}.sqlite")
    write_text(tmp_path / "time.toml", TIME_SCHEMA)
    manifest = tmp_path / "corpus.toml"
    manifest.write_text('[defaults]\nembedder = "hash"\n\n' + "\n".join(
        f'[[source]]\npath = "src/{n}.sqlite"\nschema = "time.toml"\n' for n in names
    ))
    seq = tmp_path / "seq"
    preprocess_corpus(manifest, seq, progress=False)
    out = tmp_path / "ray"
    temp = tempfile.mkdtemp(prefix="rayk", dir="/tmp")  # Ray's socket paths stay short
    cmd = [sys.executable, "-m", "headwater.cli", "preprocess", "--corpus", str(manifest),
           str(out), "--ray"]
    env = {**os.environ, "RAY_TMPDIR": temp}
    try:
        proc = subprocess.Popen(_in_own_network(cmd), stderr=subprocess.PIPE, text=True,
                                env=env, start_new_session=True)
        seen: list[str] = []
        first_done = threading.Event()

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                seen.append(line)
                if re.search(r"\] s\d\d: done in", line):
                    first_done.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first_done.wait(300), "".join(seen)[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in _pids_using(temp):  # Ray's processes, wherever their session
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
        reader.join(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        # Done is what the build recorded (`.corpus/<name>.json`, written after
        # the database's rename): a kill between the two leaves a database
        # that the rerun builds again, as it may.
        done_before = {
            n for n in names if (out / ".corpus" / f"{n}.json").is_file() and (out / n).is_dir()
        }
        assert 1 <= len(done_before) < len(names), done_before
        r = subprocess.run(_in_own_network([*cmd, "--json"]), capture_output=True, text=True,
                           env=env, timeout=600, check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    finally:
        for pid in _pids_using(temp):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    report = json.loads(r.stdout)
    status = {s["name"]: s["status"] for s in report["sources"]}
    assert {n for n, st in status.items() if st == "skipped"} == done_before
    assert all(status[n] == "done" for n in names if n not in done_before), status
    assert not [p.name for p in out.iterdir() if p.name.endswith(".partial")]
    for name in names:
        assert _bytes(out / name) == _bytes(seq / name), name
    assert (out / "corpus.toml").read_text() == (seq / "corpus.toml").read_text()
