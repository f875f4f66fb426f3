"""The dashboard's "In-context contexts" row: the in-context recipe
(``examples = true``: tiers, examples, walks, deadline), masked cells
(``mask_prob_max``), the per-sequence task mix (``task_mixing``), the
contexts of each task kind and the link tasks' candidates and positives; zero or flat on the default layout (but the
task kinds). Split from :mod:`.panels` (the other rows)."""

from __future__ import annotations

from headwater.dashboards.widgets import (
    PanelBuilder,
    Q,
    _timeseries,
    across,
    quantile,
)


def _contexts() -> list[PanelBuilder]:
    """The in-context recipe (``examples = true``): zero on the default layout."""
    return [
        _timeseries(
            "Context cells per tier/s",
            "Cells per second (cluster sum) of the seeds' own BFS (tier 0), of walk- or "
            "recency-ranked labelled examples with their shells (tier 1) and of random labelled "
            "rows (tier 2). Healthy: all three non-zero, tier 1 the bulk. Pathological: tier 1 "
            "at 0 while tier 2 fills the context (no eligible examples: the walks reach no "
            "labelled row of the seed's table before its time), or everything in tier 0.",
            [Q(across(f"context/tier{t}_cells"), f"tier {t}") for t in range(3)],
            unit="cps",
            span=8,
        ),
        _timeseries(
            "Examples per sequence p50/p95",
            "Labelled example rows (tiers 1 and 2) per sequence from the cluster-merged "
            "buckets. Healthy: tens, steady. Pathological: 0 (the context holds only the "
            "seed's neighbourhood: a cold table, or every context past its deadline).",
            [
                Q(quantile(0.5, "context/examples_per_sequence"), "p50"),
                Q(quantile(0.95, "context/examples_per_sequence"), "p95"),
            ],
            span=8,
        ),
        _timeseries(
            "Walk steps/s, deadline hits/s, store misses/s, sequences without examples/s",
            "Random-walk steps taken ranking examples, contexts abandoned past "
            "context_deadline_ms (replaced by the seed's plain context), contexts whose stored "
            "ranking ran out (expected_store: ranked live), and sequences built in "
            "time that hold no example, per second, cluster sum. Healthy: walk steps ~ "
            "num_walks x walk_length x contexts/s, deadline hits 0, sequences without examples "
            "near 0, stored rankings run out (expected_store) a small share of the sequence rate. Pathological: deadline hits above 0 (hub rows, a deadline below the walk "
            "cost); sequences without examples ~ the sequence rate (no labelled row of the "
            "seed's table dated before it, or tier 0 takes the whole context).",
            [
                Q(across("context/walk_steps"), "walk steps/s"),
                Q(across("context/deadline_hits"), "deadline hits/s"),
                Q(across("context/store_misses"), "stored rankings run out/s"),
                Q(across("context/no_examples"), "sequences without examples/s"),
            ],
            unit="cps",
            span=8,
        ),
        _timeseries(
            "Masked cells per sequence p50/p95",
            "Cells masked as extra targets per sequence (mask_prob_max), from the "
            "cluster-merged buckets. Healthy: 0 without masking; with it, about "
            "mask_prob_max / 2 of a sequence's cells. Pathological: most of the sequence "
            "(contexts that are mostly targets leave the model little to read).",
            [
                Q(quantile(0.5, "context/masked_cells"), "p50"),
                Q(quantile(0.95, "context/masked_cells"), "p95"),
            ],
            span=8,
        ),
        _timeseries(
            "Tasks per batch",
            "Distinct tasks among a batch's sequences, most on any rank (each task's share: "
            "the per-task seeds panel). Healthy: 1 with task_mixing = step; with sequence, "
            "about the tasks with weight > 0. Pathological: 1 with task_mixing = sequence "
            "(one task has all the weight, or the others have no seeds in the split).",
            [Q(across("context/tasks_per_batch"), "tasks")],
            span=8,
        ),
        *_kinds_and_links(),
    ]


def _kinds_and_links() -> list[PanelBuilder]:
    """Contexts per task kind, and the link tasks' candidates and positives."""
    return [
        _timeseries(
            "Contexts per task kind/s",
            "Contexts (seeds) per second of each task kind (cell, sql, relbench, link; other: a kind "
            "not named), cluster sum: they add up to the seeds drawn, each kind's the sum of "
            "its tasks' (the per-task seeds panel). Healthy: the kinds in the shares of their "
            "tasks' weights. Pathological: a kind whose tasks have weight at 0 (with examples, "
            "a SQL task without a window gets weight 0 under RT-J's recipe), or other above 0 "
            "(a task kind the telemetry does not name).",
            [Q(across("task_kinds/{kind}", by="kind"), "{{kind}}")],
            unit="cps",
            span=8,
        ),
        _timeseries(
            "Link tasks: candidate recall",
            "The least candidate recall of the link tasks drawn, cluster min: the share of "
            "their training groups' positives the candidate generator found, as preprocessing "
            "measured it (1 without a link task). Healthy: above 0.5. Pathological: below it "
            "(the evaluation ranks only the candidates, so MAP reads the generator, not the "
            "model: more candidates, or a generator that knows the data).",
            [Q(across("link/candidate_recall"), "candidate recall")],
            span=8,
        ),
        _timeseries(
            "Link tasks: positive example labels/s",
            "Example labels shown in link contexts that are positive (a candidate linked "
            "within its window), per second, cluster sum; over the link contexts/s (task "
            "kinds panel) it is the positives a context shows. Healthy: a few per context "
            "with examples on, 0 without. Pathological: 0 with examples on (no linked "
            "candidate among the examples: nothing to learn a link from in context).",
            [Q(across("link/positive_examples"), "positive example labels/s")],
            unit="cps",
            span=8,
        ),
    ]
