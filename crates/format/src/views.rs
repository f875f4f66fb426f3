//! Zero-copy views of a database's files, each read checked (see
//! [`super::blocks`]): a view backed by a file checks the blocks of what it
//! hands out before the sampler uses it — the graph's rows and edge lists
//! and a table's cells per access, one relaxed load per block once checked.
//! The slice fields stay public for whole-array readers (tests, the Python
//! inspection API); the sampler reads through the methods.

// The per-read checks are forced inline: out of line, a call per cell
// cost a measured ~10% of the sampler's CPU.
#![allow(clippy::inline_always)]

use super::header::MappedFile;

/// Zero-copy view of `graph.bin`.
#[derive(Clone, Copy)]
pub struct GraphView<'a> {
    /// Table index of every global row.
    pub row_table: &'a [u16],
    /// Time of every row (`i64::MIN` for rows without time).
    pub row_time: &'a [i64],
    /// CSR offsets of each row's parents.
    pub fwd_offsets: &'a [u64],
    /// Parent rows (child → parent edges).
    pub fwd_targets: &'a [u32],
    /// CSR offsets of each row's children.
    pub rev_offsets: &'a [u64],
    /// Child rows, time-sorted per parent.
    pub rev_targets: &'a [u32],
    /// Time of each child in `rev_targets`.
    pub rev_times: &'a [i64],
    /// Global row range `[start, end)` of each table, from the metadata.
    pub table_rows: &'a [(u32, u32)],
    /// The file whose blocks the methods check (`None`: not file-backed,
    /// as a graph built in memory by a test).
    pub file: Option<&'a MappedFile>,
}

impl<'a> GraphView<'a> {
    /// Check the blocks holding `s` (a slice of the graph's sections).
    #[inline(always)]
    fn touch<T>(&self, s: &[T]) {
        if let Some(f) = self.file {
            f.touch_slice(s);
        }
    }

    /// Check the block holding `r` (an element of the graph's sections).
    #[inline(always)]
    fn touch_one<T>(&self, r: &T) {
        if let Some(f) = self.file {
            f.touch_ref(r);
        }
    }

    /// The CSR range of `row` in `offsets`, checked before it is read.
    #[inline(always)]
    fn range(&self, offsets: &[u64], row: u32) -> Option<std::ops::Range<usize>> {
        let r = row as usize;
        let pair = offsets.get(r..r.checked_add(2)?)?;
        self.touch(pair);
        Some(pair[0] as usize..pair[1] as usize)
    }

    /// Parents of `row` (F→P); empty when `row` or its CSR offsets are out
    /// of range (a corrupt payload gives a wrong but safe answer).
    #[inline(always)]
    pub fn parents(&self, row: u32) -> &'a [u32] {
        let Some(ids) = self
            .range(self.fwd_offsets, row)
            .and_then(|range| self.fwd_targets.get(range))
        else {
            return &[];
        };
        self.touch(ids);
        ids
    }

    /// Children of `row` (P→F) with their times, sorted by time; empty when
    /// `row` or its CSR offsets are out of range.
    #[inline(always)]
    pub fn children(&self, row: u32) -> (&'a [u32], &'a [i64]) {
        if let Some(range) = self.range(self.rev_offsets, row) {
            if let (Some(ids), Some(times)) = (
                self.rev_targets.get(range.clone()),
                self.rev_times.get(range),
            ) {
                self.touch(ids);
                self.touch(times);
                return (ids, times);
            }
        }
        (&[], &[])
    }

    /// The table of global `row`, or `None` when `row` is out of range or
    /// its `row_table` entry disagrees with the metadata's table ranges (a
    /// corrupt payload). Every row the sampler reads cells of passed this.
    #[inline(always)]
    pub fn table_of(&self, row: u32) -> Option<usize> {
        let t = usize::from(self.table_code(row)?);
        let &(lo, hi) = self.table_rows.get(t)?;
        (lo <= row && row < hi).then_some(t)
    }

    /// The `row_table` entry of `row` as stored (not checked against the
    /// table ranges: [`table_of`](Self::table_of) does that).
    #[inline(always)]
    pub fn table_code(&self, row: u32) -> Option<u16> {
        let t = self.row_table.get(row as usize)?;
        self.touch_one(t);
        Some(*t)
    }

    /// The time of `row` (`i64::MIN`: none), or `None` out of range.
    #[inline(always)]
    pub fn time_of(&self, row: u32) -> Option<i64> {
        let t = self.row_time.get(row as usize)?;
        self.touch_one(t);
        Some(*t)
    }

    /// Children of `row` whose time is `<= cutoff` (a prefix: binary search).
    #[inline]
    pub fn children_visible_at(&self, row: u32, cutoff: i64) -> &'a [u32] {
        let (ids, times) = self.children(row);
        let n = times.partition_point(|&t| t <= cutoff);
        &ids[..n]
    }

    /// Rows in the database.
    pub fn num_rows(&self) -> usize {
        self.row_table.len()
    }
}

/// One stored column: values (typed by semantic type) and validity bitmap.
#[derive(Clone, Copy)]
pub enum ColumnValues<'a> {
    /// z-scored f32 values.
    Numerical(&'a [f32]),
    /// 0/1 values.
    Boolean(&'a [u8]),
    /// Microseconds since the epoch.
    Timestamp(&'a [i64]),
    /// Global category embedding ids.
    Categorical(&'a [u32]),
    /// Global text embedding ids.
    Text(&'a [u32]),
}

#[derive(Clone, Copy)]
/// One stored column of a table.
pub struct ColumnView<'a> {
    /// Global column index (metadata order).
    pub column_idx: u32,
    /// The values, one per row of the table.
    pub values: ColumnValues<'a>,
    /// Validity bitmap (bit set = not null).
    pub validity: &'a [u8],
    /// The metadata counts no null in the column: every value is present
    /// and the bitmap need not be read (a cache miss per cell saved). The
    /// metadata is hash-checked at open; a payload bitmap that disagrees
    /// (corruption) then reads as present, a wrong but safe value.
    pub all_valid: bool,
    /// The table file and where the column's values and bitmap start in
    /// it, whose blocks [`read`](Self::read) checks.
    pub(crate) file: Option<CellCheck<'a>>,
}

impl ColumnValues<'_> {
    /// Bytes per value.
    pub fn elem_size(&self) -> usize {
        match self {
            ColumnValues::Boolean(_) => 1,
            ColumnValues::Numerical(_) | ColumnValues::Categorical(_) | ColumnValues::Text(_) => 4,
            ColumnValues::Timestamp(_) => 8,
        }
    }

    /// Where table-local `row`'s value lies in the map, without reading
    /// it (`None` past the column's end): for a residency probe, which asks
    /// the kernel about the page and must not fault it in.
    pub fn addr(&self, row: usize) -> Option<*const u8> {
        fn at<T>(s: &[T], row: usize) -> Option<*const u8> {
            s.get(row).map(|v| std::ptr::from_ref(v).cast::<u8>())
        }
        match self {
            ColumnValues::Numerical(s) => at(s, row),
            ColumnValues::Boolean(s) => at(s, row),
            ColumnValues::Timestamp(s) => at(s, row),
            ColumnValues::Categorical(s) | ColumnValues::Text(s) => at(s, row),
        }
    }
}

impl ColumnView<'_> {
    #[inline]
    /// Is the value of table-local `row` present? (Unchecked: the sampler
    /// reads cells with [`read`](Self::read).)
    pub fn is_valid(&self, row: usize) -> bool {
        self.all_valid || super::bit(self.validity, row)
    }

    /// Check the blocks holding table-local `row`'s value and validity bit,
    /// then say whether the value is present: how the sampler reads a cell.
    #[inline(always)]
    pub fn read(&self, row: usize) -> bool {
        if let Some(c) = &self.file {
            c.file
                .touch_at(c.values_at.wrapping_add(row.wrapping_mul(c.size)));
            if !self.all_valid {
                c.file.touch_at(c.validity_at.wrapping_add(row >> 3));
            }
        }
        self.is_valid(row)
    }
}

/// Where a column lies in its table file, for [`ColumnView::read`].
#[derive(Clone, Copy)]
pub(crate) struct CellCheck<'a> {
    /// The table file.
    pub(crate) file: &'a MappedFile,
    /// File offsets of the values section and of the validity bitmap.
    pub(crate) values_at: usize,
    pub(crate) validity_at: usize,
    /// Bytes per value.
    pub(crate) size: usize,
}

/// Zero-copy view of one table file.
pub struct TableView<'a> {
    /// Global index of the table's first row.
    pub row_offset: u32,
    /// Rows of the table.
    pub num_rows: u32,
    /// The stored columns, in slot order.
    pub columns: Vec<ColumnView<'a>>,
}

/// Zero-copy view of one task file.
#[derive(Clone, Copy)]
pub struct TaskView<'a> {
    /// Global anchor row of each seed.
    pub anchor_rows: &'a [u32],
    /// Observation time of each seed (µs).
    pub obs_times: &'a [i64],
    /// Target value of each seed.
    pub targets: ColumnValues<'a>,
    /// Validity bitmap of the targets.
    pub target_validity: &'a [u8],
    /// Stored split code of each seed (0 train, 1 val, 2 test), when the
    /// task keeps its source's splits; `None`: the hash rule splits it.
    pub splits: Option<&'a [u8]>,
    /// The task file whose blocks the accessors check (`None`: a view
    /// checked whole, or every block of the file already checked).
    pub(crate) file: Option<&'a MappedFile>,
}

impl<'a> TaskView<'a> {
    /// Check the block holding `s[i]`, if any.
    #[inline(always)]
    fn touch_elem<T>(&self, s: &[T], i: usize) {
        if let (Some(f), Some(x)) = (self.file, s.get(i)) {
            f.touch_ref(x);
        }
    }

    /// Check the blocks of a whole section `s` of this task.
    #[inline]
    fn touch_all<T>(&self, s: &'a [T]) -> &'a [T] {
        if let Some(f) = self.file {
            f.touch_slice(s);
        }
        s
    }

    /// Seeds of the task.
    #[inline]
    pub fn len(&self) -> usize {
        self.anchor_rows.len()
    }

    /// Whether the task has no seeds.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.anchor_rows.is_empty()
    }

    /// Anchor row of seed `i`, its block checked; `None` out of range.
    #[inline]
    pub fn anchor_row(&self, i: usize) -> Option<u32> {
        self.touch_elem(self.anchor_rows, i);
        self.anchor_rows.get(i).copied()
    }

    /// Stored split code of seed `i`, its block checked (`None`: out of
    /// range, or the task has no stored splits).
    #[inline]
    pub fn split_code(&self, i: usize) -> Option<u8> {
        let codes = self.splits?;
        self.touch_elem(codes, i);
        codes.get(i).copied()
    }

    /// Check the blocks of everything a batch reads of seed `i`: its anchor
    /// row, observation time, target value and validity bit, stored split.
    #[inline]
    pub fn check_seed(&self, i: usize) {
        if self.file.is_none() {
            return;
        }
        self.touch_elem(self.anchor_rows, i);
        self.touch_elem(self.obs_times, i);
        self.touch_elem(self.target_validity, i / 8);
        match self.targets {
            ColumnValues::Numerical(s) => self.touch_elem(s, i),
            ColumnValues::Boolean(s) => self.touch_elem(s, i),
            ColumnValues::Timestamp(s) => self.touch_elem(s, i),
            ColumnValues::Categorical(s) | ColumnValues::Text(s) => self.touch_elem(s, i),
        }
        if let Some(codes) = self.splits {
            self.touch_elem(codes, i);
        }
    }

    /// Every anchor row, each block checked (a reader of the whole section).
    pub fn checked_anchor_rows(&self) -> &'a [u32] {
        self.touch_all(self.anchor_rows)
    }

    /// Every stored split code, each block checked.
    pub fn checked_splits(&self) -> Option<&'a [u8]> {
        self.splits.map(|s| self.touch_all(s))
    }
}
/// Rows of an embedding matrix `[N, D]` (row-major), each row's blocks
/// checked as it is read.
#[derive(Clone, Copy)]
pub struct EmbeddingRows<'a> {
    /// The matrix.
    pub data: &'a [half::f16],
    /// Values per row (`D`).
    pub dim: usize,
    /// The embedding file whose section 0 `data` is (`None`: unchecked).
    pub(crate) file: Option<&'a MappedFile>,
}

impl<'a> EmbeddingRows<'a> {
    /// Rows of `data` not backed by a file (nothing to check).
    pub fn unchecked(data: &'a [half::f16], dim: usize) -> Self {
        EmbeddingRows {
            data,
            dim,
            file: None,
        }
    }

    /// Row `i`, its blocks checked; `None` when out of range.
    #[inline]
    pub fn row(&self, i: usize) -> Option<&'a [half::f16]> {
        let lo = i.checked_mul(self.dim)?;
        let r = self.data.get(lo..lo.checked_add(self.dim)?)?;
        if let Some(f) = self.file {
            f.touch_slice(r);
        }
        Some(r)
    }
}
