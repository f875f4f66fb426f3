//! The BFS scratch is sized to the BFS, not to the database.

use headwater::preprocess::{synth_database, SynthSpec};

#[test]
fn bfs_scratch_is_sized_to_the_bfs_not_the_database() {
    use headwater::context::{bfs, BfsParams, BfsScratch, Subgraph};
    use headwater::rng::Xoshiro256pp;
    use headwater::Database;

    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    synth_database(&db, &SynthSpec::small(4, 250_000, 3)).unwrap();
    let db = Database::open(&db).unwrap();
    let g = db.graph();
    let rows = g.num_rows();
    let row_cells: Vec<u16> = db
        .metadata()
        .tables
        .iter()
        .map(|t| t.columns.len() as u16)
        .collect();
    let p = BfsParams {
        max_cells: 1024,
        max_hops: 3,
        child_width: 16,
        temporal_filter: false,
    };
    let (mut scratch, mut sub) = (BfsScratch::default(), Subgraph::default());
    let mut rng = Xoshiro256pp::seed_from_u64(5);
    let mut most_rows = 0;
    for seed in (0..rows as u32).step_by(rows / 500) {
        bfs(
            &g,
            &row_cells,
            seed,
            4,
            i64::MAX,
            &p,
            &mut rng,
            &mut scratch,
            &mut sub,
        );
        most_rows = most_rows.max(sub.rows.len());
    }
    assert!(
        most_rows > 50,
        "the BFS must reach rows to test anything: {most_rows}"
    );
    // The old scratch held 6 bytes per database row; the visited set holds
    // at most 2 slots of 12 bytes per visited row (a BFS visits at most
    // 1 + hops · S · (parents + width) rows), plus one hop's lists.
    let bytes = scratch.heap_bytes();
    let bound = 2 * 12 * (1 + 3 * 1024 * (2 + 16)) + 4 * 5 * 1024 * 18;
    assert!(bytes <= bound, "scratch {bytes} bytes > bound {bound}");
    assert!(
        bytes * 10 < rows * 6,
        "scratch {bytes} bytes for {rows} rows"
    );
}
