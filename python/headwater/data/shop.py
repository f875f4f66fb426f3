"""A generated shop in RelBench's folder format, with a recommendation
task: which items will a user buy in the next 30 days?

Users (a country, a signup time), items (a category, a price) and
purchases (user, item, time, amount) over one year. Each user has a
favourite category (not stored); a purchase is a repeat of one of the
user's own earlier items (probability ``REPEAT``), an item of the favourite
category (``FAVOURITE``), or any item, items drawn by a popularity that
differs by category. So the user's history tells more than popularity does:
a ranking that reads it beats the popularity baseline.

:func:`write_shop` writes ``db/*.parquet``, ``manifest.yaml`` and the task
``user-item-purchase`` (``task_type: recommendation``, ``eval_k`` 10,
``timedelta`` 30 days; train labels every 30 days before the validation
time, val and test labels at their times), as RelBench lays them out. The
same arguments write the same bytes.

``python -m headwater.data.shop OUT [--users N] [--seed S] [--build]``
writes the folder ``OUT/shop`` (and with ``--build`` preprocesses it into
``OUT/db`` with the hash embedder).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

#: The task's name, window and k.
TASK, WINDOW_DAYS, EVAL_K = "user-item-purchase", 30, 10
#: How a purchase picks its item.
REPEAT, FAVOURITE = 0.3, 0.5

_BASE = dt.datetime(2023, 1, 1)
_DAYS = 365
_CATEGORIES = ("books", "garden", "kitchen", "music", "sport", "toys", "tools", "games")
_COUNTRIES = ("FR", "PT", "FI", "IE", "JP", "BR")
VAL_TIME = _BASE + dt.timedelta(days=_DAYS - 2 * WINDOW_DAYS)
TEST_TIME = _BASE + dt.timedelta(days=_DAYS - WINDOW_DAYS)


def _purchases(
    rng: random.Random, users: list[dict], items: list[dict], per_user: float
) -> list[dict]:
    by_cat: dict[str, list[int]] = {c: [] for c in _CATEGORIES}
    for it in items:
        by_cat[it["category"]].append(it["item_id"])
    # Popularity: Zipf within the shop, shuffled per category.
    weight = {it["item_id"]: 1.0 / (1 + r) for r, it in enumerate(rng.sample(items, len(items)))}
    out: list[dict] = []
    for u in users:
        fav = rng.choice(_CATEGORIES)
        own: list[int] = []
        n = max(1, int(rng.expovariate(1 / per_user)))
        start = (u["signup"] - _BASE).total_seconds()
        times = sorted(rng.uniform(start, _DAYS * 86400.0) for _ in range(n))
        for t in times:
            x = rng.random()
            if own and x < REPEAT:
                item = rng.choice(own)
            else:
                pool = by_cat[fav] if x < REPEAT + FAVOURITE else list(weight)
                item = rng.choices(pool, weights=[weight[i] for i in pool])[0]
            own.append(item)
            out.append({
                "purchase_id": 0, "user_id": u["user_id"], "item_id": item,
                "ts": _BASE + dt.timedelta(seconds=round(t)),
                "amount": round(rng.uniform(0.5, 1.5) * items[item]["price"], 2),
            })
    out.sort(key=lambda p: (p["ts"], p["user_id"]))
    for i, p in enumerate(out):
        p["purchase_id"] = i
    return out


def _labels(purchases: list[dict], times: list[dt.datetime]) -> pa.Table:
    """Per time t: each user's items bought in (t, t + window]."""
    w = dt.timedelta(days=WINDOW_DAYS)
    rows: dict[tuple[dt.datetime, int], list[int]] = {}
    for t in times:
        for p in purchases:
            if t < p["ts"] <= t + w:
                items = rows.setdefault((t, p["user_id"]), [])
                if p["item_id"] not in items:
                    items.append(p["item_id"])
    keys = sorted(rows)
    return pa.table({
        "timestamp": pa.array([k[0] for k in keys], pa.timestamp("ns")),
        "user_id": pa.array([k[1] for k in keys], pa.int64()),
        "item_id": pa.array([rows[k] for k in keys], pa.list_(pa.int64())),
    })


def write_shop(out: Path, users: int = 400, items: int = 160, per_user: float = 24.0, seed: int = 0) -> Path:
    """The shop folder ``out`` (created); returns it."""
    rng = random.Random(seed)
    us = [
        {"user_id": i, "country": rng.choice(_COUNTRIES),
         "signup": _BASE + dt.timedelta(days=rng.uniform(0, 120))}
        for i in range(users)
    ]
    its = [
        {"item_id": i, "category": _CATEGORIES[i % len(_CATEGORIES)],
         "price": round(rng.uniform(2, 80), 2)}
        for i in range(items)
    ]
    buys = _purchases(rng, us, its, per_user)
    (out / "db").mkdir(parents=True, exist_ok=True)
    for name, rows in (("users", us), ("items", its), ("purchases", buys)):
        pq.write_table(pa.Table.from_pylist(rows), out / "db" / f"{name}.parquet")
    manifest = {
        "name": "shop", "val_timestamp": VAL_TIME.isoformat(), "test_timestamp": TEST_TIME.isoformat(),
        "tables": {
            "users": {"pkey": "user_id", "time_col": "signup"},
            "items": {"pkey": "item_id"},
            "purchases": {"pkey": "purchase_id", "time_col": "ts",
                          "fkeys": {"user_id": "users", "item_id": "items"}},
        },
    }
    (out / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    tdir = out / "tasks" / TASK
    tdir.mkdir(parents=True, exist_ok=True)
    task = {
        "name": TASK, "kind": "forecast", "task_type": "recommendation",
        "description": f"the items a user buys in the next {WINDOW_DAYS} days",
        "src_entity_table": "users", "src_entity_col": "user_id",
        "dst_entity_table": "items", "dst_entity_col": "item_id",
        "time_col": "timestamp", "timedelta": f"{WINDOW_DAYS} days", "eval_k": EVAL_K,
    }
    (tdir / "manifest.yaml").write_text(yaml.safe_dump(task, sort_keys=False), encoding="utf-8")
    step = dt.timedelta(days=WINDOW_DAYS)
    train_times, t = [], VAL_TIME - step
    while t > _BASE + step:
        train_times.append(t)
        t -= step
    for split, times in (("train", sorted(train_times)), ("val", [VAL_TIME]), ("test", [TEST_TIME])):
        pq.write_table(_labels(buys, times), tdir / f"{split}.parquet")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headwater.data.shop", description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--users", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", action="store_true", help="also preprocess it into OUT/db")
    a = ap.parse_args(argv)
    folder = write_shop(a.out / "shop", users=a.users, seed=a.seed)
    print(f"wrote {folder}")
    if a.build:
        from headwater.preprocessing import preprocess

        preprocess(folder, a.out / "db", embedder="hash", overwrite=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
