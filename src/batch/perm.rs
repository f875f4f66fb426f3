//! Reverse Cuthill–McKee ordering of a sequence's rows.
//!
//! RCM is defined on a symmetric structure, so the traversal runs over the
//! undirected row graph (every FK edge both ways): each connected component is
//! laid out contiguously and neighbours stay close (a narrow band for
//! block-sparse attention). The direction decides priority: the outbound
//! order expands a row's parents (out-edges) before its children, the inbound
//! order its children first; each group by increasing degree.

/// Reusable buffers for [`rcm_order`].
#[derive(Debug, Default)]
pub struct RcmScratch {
    deg: Vec<u32>,
    start_out: Vec<u32>,
    start_in: Vec<u32>,
    fill: Vec<u32>,
    adj_out: Vec<u16>,
    adj_in: Vec<u16>,
    seen: Vec<bool>,
    by_degree: Vec<u16>,
}

fn csr(
    n: usize,
    edges: &[(u16, u16)],
    forward: bool,
    start: &mut Vec<u32>,
    adj: &mut Vec<u16>,
    fill: &mut Vec<u32>,
) {
    start.clear();
    start.resize(n + 1, 0);
    for &(c, p) in edges {
        let from = if forward { c } else { p };
        start[from as usize + 1] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    adj.clear();
    adj.resize(edges.len(), 0);
    fill.clear();
    fill.extend_from_slice(&start[..n]);
    for &(c, p) in edges {
        let (from, to) = if forward { (c, p) } else { (p, c) };
        let slot = &mut fill[from as usize];
        adj[*slot as usize] = to;
        *slot += 1;
    }
}

/// RCM order of `n` rows linked by `(child, parent)` edges; `outbound`
/// selects which neighbours are expanded first. The result is a permutation
/// of `0..n` written to `order`.
pub fn rcm_order(
    n: usize,
    edges: &[(u16, u16)],
    outbound: bool,
    order: &mut Vec<u16>,
    scratch: &mut RcmScratch,
) {
    prepare(n, edges, scratch);
    rcm_from(n, outbound, order, scratch);
}

/// Both RCM orders of one row graph (outbound, inbound), building its
/// adjacency once.
pub fn rcm_orders(
    n: usize,
    edges: &[(u16, u16)],
    out: &mut Vec<u16>,
    inn: &mut Vec<u16>,
    scratch: &mut RcmScratch,
) {
    prepare(n, edges, scratch);
    rcm_from(n, true, out, scratch);
    rcm_from(n, false, inn, scratch);
}

/// The adjacency both ways, the degrees and the rows by (degree, row).
fn prepare(n: usize, edges: &[(u16, u16)], s: &mut RcmScratch) {
    csr(
        n,
        edges,
        true,
        &mut s.start_out,
        &mut s.adj_out,
        &mut s.fill,
    );
    csr(n, edges, false, &mut s.start_in, &mut s.adj_in, &mut s.fill);
    s.deg.clear();
    s.deg.extend(
        (0..n).map(|i| s.start_out[i + 1] - s.start_out[i] + s.start_in[i + 1] - s.start_in[i]),
    );
    // Rows by (degree, row): a counting sort by degree (stable, so rows
    // stay ascending within a degree).
    let max_deg = s.deg.iter().copied().max().unwrap_or(0) as usize;
    s.fill.clear();
    s.fill.resize(max_deg + 2, 0);
    for &d in &s.deg {
        s.fill[d as usize + 1] += 1;
    }
    for i in 1..s.fill.len() {
        s.fill[i] += s.fill[i - 1];
    }
    s.by_degree.clear();
    s.by_degree.resize(n, 0);
    for (i, &d) in s.deg.iter().enumerate() {
        let slot = &mut s.fill[d as usize];
        s.by_degree[*slot as usize] = i as u16;
        *slot += 1;
    }
}

/// The RCM traversal over the adjacency [`prepare`] built.
fn rcm_from(n: usize, outbound: bool, order: &mut Vec<u16>, s: &mut RcmScratch) {
    s.seen.clear();
    s.seen.resize(n, false);
    let deg = &s.deg;
    order.clear();
    for k in 0..n {
        let root = s.by_degree[k];
        if s.seen[root as usize] {
            continue;
        }
        s.seen[root as usize] = true;
        let mut head = order.len();
        order.push(root);
        while head < order.len() {
            let u = order[head] as usize;
            head += 1;
            let (first, second) = if outbound {
                (
                    &s.adj_out[s.start_out[u] as usize..s.start_out[u + 1] as usize],
                    &s.adj_in[s.start_in[u] as usize..s.start_in[u + 1] as usize],
                )
            } else {
                (
                    &s.adj_in[s.start_in[u] as usize..s.start_in[u + 1] as usize],
                    &s.adj_out[s.start_out[u] as usize..s.start_out[u + 1] as usize],
                )
            };
            for group in [first, second] {
                let from = order.len();
                for &v in group {
                    if !s.seen[v as usize] {
                        s.seen[v as usize] = true;
                        order.push(v);
                    }
                }
                order[from..].sort_by_key(|&v| (deg[v as usize], v));
            }
        }
    }
    order.reverse();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_with_contiguous_components_and_direction_priority() {
        // Component A: row 0 references rows 1 and 5; row 2 references 0.
        // Component B: row 3 references row 4.
        let edges = [(0u16, 1u16), (0, 5), (2, 0), (3, 4)];
        let mut s = RcmScratch::default();
        let (mut out, mut inn) = (vec![], vec![]);
        rcm_order(6, &edges, true, &mut out, &mut s);
        rcm_order(6, &edges, false, &mut inn, &mut s);
        // BFS from the lowest-degree row 1 reaches 0, whose unseen neighbours
        // are its parent 5 and its child 2: outbound takes 5 first, inbound 2.
        assert_eq!(out, vec![4, 3, 2, 5, 0, 1]);
        assert_eq!(inn, vec![4, 3, 5, 2, 0, 1]);
        for order in [&out, &inn] {
            let pos = |r: u16| order.iter().position(|&x| x == r).unwrap() as i32;
            assert_eq!(
                (pos(3) - pos(4)).abs(),
                1,
                "component B contiguous: {order:?}"
            );
        }
    }

    #[test]
    fn rows_by_degree_match_a_comparison_sort() {
        let mut rng = crate::rng::Xoshiro256pp::seed_from_u64(4);
        let mut s = RcmScratch::default();
        let mut order = vec![];
        for _ in 0..200 {
            let n = 1 + rng.below(60) as usize;
            let edges: Vec<(u16, u16)> = (0..rng.below(3 * n as u64))
                .map(|_| (rng.below(n as u64) as u16, rng.below(n as u64) as u16))
                .collect();
            rcm_order(n, &edges, true, &mut order, &mut s);
            let mut want: Vec<u16> = (0..n as u16).collect();
            want.sort_by_key(|&i| (s.deg[i as usize], i));
            assert_eq!(s.by_degree, want);
            let mut seen = order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..n as u16).collect::<Vec<_>>());
        }
    }

    #[test]
    fn both_orders_at_once_are_each_order_alone() {
        let mut rng = crate::rng::Xoshiro256pp::seed_from_u64(6);
        let mut s = RcmScratch::default();
        let (mut out, mut inn, mut one) = (vec![], vec![], vec![]);
        for _ in 0..100 {
            let n = 1 + rng.below(40) as usize;
            let edges: Vec<(u16, u16)> = (0..rng.below(2 * n as u64))
                .map(|_| (rng.below(n as u64) as u16, rng.below(n as u64) as u16))
                .collect();
            rcm_orders(n, &edges, &mut out, &mut inn, &mut s);
            rcm_order(n, &edges, true, &mut one, &mut s);
            assert_eq!(out, one);
            rcm_order(n, &edges, false, &mut one, &mut s);
            assert_eq!(inn, one);
        }
    }
}
