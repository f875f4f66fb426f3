"""Build a corpus on a local two-node Ray cluster (for ``test_corpus.py``).

``python ray_corpus.py MANIFEST OUT`` (Ray's files under ``RAY_TMPDIR``) starts a Ray cluster of two
nodes of one CPU each on this host (Ray's own multi-node test harness,
``ray.cluster_utils.Cluster``: a head and a second raylet, as
``ray start --head`` then ``ray start --address`` would on two machines),
runs :func:`headwater.preprocessing.corpus.preprocess_corpus` on it through
its address, runs it again (everything built is then skipped), stops the
cluster's processes, then builds the corpus into ``OUT_local`` on a local
Ray instance that ``preprocess_corpus(ray=True)`` starts and stops itself,
and prints the three reports as one JSON line (``--local-only``: only the
local instance's build). The test runs
it in a network namespace of its own where one can be made (root:
``unshare -n``), so Ray's servers, which listen on every interface, are
reachable only through loopback.
"""

from __future__ import annotations

import json
import sys

from ray.cluster_utils import Cluster

from headwater.preprocessing.corpus import preprocess_corpus


def main() -> None:
    manifest, out = sys.argv[1:3]
    if sys.argv[3:] == ["--local-only"]:
        print(json.dumps({"local": preprocess_corpus(manifest, f"{out}_local", ray=True)}))
        return
    args = {"num_cpus": 1, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=args)
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        first = preprocess_corpus(manifest, out, ray_address=cluster.address)
        again = preprocess_corpus(manifest, out, ray_address=cluster.address)
    finally:
        cluster.shutdown()
    local = preprocess_corpus(manifest, f"{out}_local", ray=True)
    print(json.dumps({"first": first, "again": again, "local": local}))


if __name__ == "__main__":
    main()
