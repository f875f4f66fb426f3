//! Reverse Cuthill–McKee ordering of a sequence's rows.

/// RCM order of `n` rows whose neighbours (in the chosen direction) are given
/// by `adj(i)`: breadth-first from the lowest-degree unvisited row, neighbours
/// by increasing degree, components one after another; then reversed.
/// Scratch vectors are reused.
pub fn rcm_order(
    n: usize,
    edges: &[(u16, u16)],
    outbound: bool,
    order: &mut Vec<u16>,
    scratch: &mut RcmScratch,
) {
    let s = scratch;
    s.deg.clear();
    s.deg.resize(n, 0);
    for &(c, p) in edges {
        let from = if outbound { c } else { p };
        s.deg[from as usize] += 1;
    }
    s.start.clear();
    s.start.push(0);
    for i in 0..n {
        let v = s.start[i] + s.deg[i];
        s.start.push(v);
    }
    s.adj.clear();
    s.adj.resize(edges.len(), 0);
    s.fill.clear();
    s.fill.extend_from_slice(&s.start[..n]);
    for &(c, p) in edges {
        let (from, to) = if outbound { (c, p) } else { (p, c) };
        let slot = &mut s.fill[from as usize];
        s.adj[*slot as usize] = to;
        *slot += 1;
    }
    s.seen.clear();
    s.seen.resize(n, false);
    s.by_degree.clear();
    s.by_degree.extend(0..n as u16);
    let deg = &s.deg;
    s.by_degree.sort_by_key(|&i| (deg[i as usize], i));
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
            let first = order.len();
            for &v in &s.adj[s.start[u] as usize..s.start[u + 1] as usize] {
                if !s.seen[v as usize] {
                    s.seen[v as usize] = true;
                    order.push(v);
                }
            }
            order[first..].sort_by_key(|&v| (deg[v as usize], v));
        }
    }
    order.reverse();
}

/// Reusable buffers for [`rcm_order`].
#[derive(Debug, Default)]
pub struct RcmScratch {
    deg: Vec<u32>,
    start: Vec<u32>,
    fill: Vec<u32>,
    adj: Vec<u16>,
    seen: Vec<bool>,
    by_degree: Vec<u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_permutation_and_keeps_components_contiguous() {
        // Two components: 0-1-2 (path) and 3-4.
        let edges = [(1u16, 0u16), (2, 1), (4, 3)];
        let mut order = vec![];
        let mut s = RcmScratch::default();
        for outbound in [true, false] {
            rcm_order(5, &edges, outbound, &mut order, &mut s);
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
            let pos = |r: u16| order.iter().position(|&x| x == r).unwrap() as i32;
            assert_eq!((pos(3) - pos(4)).abs(), 1, "{order:?}");
        }
    }
}
