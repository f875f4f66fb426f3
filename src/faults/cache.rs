//! The small page cache of `debug_page_cache_bytes`: a host whose page
//! cache holds only so many bytes of the sampler's databases, for the
//! "corpus larger than memory" diagnostic
//! (`diag_configs/memory/larger_than_memory.toml`).
//!
//! **What it models.** The kernel keeps the pages read most recently and
//! evicts the rest when the memory is full. Here the unit is a database:
//! before a batch is built, the databases it reads become the most recently
//! read, and those read least recently are dropped (from this process's
//! maps and from the page cache, [`super::drop_page_cache`]) until the
//! files of the ones kept add up to at most the capacity. A database larger
//! than the capacity is kept alone. Whole databases, not pages, because the
//! question the diagnostic asks is the corpus's: do the databases a stretch
//! of batches reads fit (hot sets), or does every batch read one that was
//! evicted. What the hot sets read ahead (`hot.rs`) is not counted until a
//! batch reads it.
//!
//! Never: changes what a batch holds (a drop only costs faults), or runs
//! unless the key is set.

use std::sync::Mutex;

/// Which databases the small page cache holds, most recently read first.
pub(crate) struct SmallCache {
    capacity: u64,
    recent: Mutex<Vec<usize>>,
}

impl SmallCache {
    pub(crate) fn new(capacity: u64) -> Self {
        Self {
            capacity,
            recent: Mutex::new(Vec::new()),
        }
    }

    /// A batch is about to read the databases `used` (mixture indices; the
    /// file bytes of database `i` are `bytes[i]`): they become the most
    /// recently read. Returns the databases to drop, least recently read
    /// first: every one past the capacity.
    pub(crate) fn read(&self, used: &[usize], bytes: &[u64]) -> Vec<usize> {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        recent.retain(|i| !used.contains(i));
        let mut order: Vec<usize> = Vec::with_capacity(used.len() + recent.len());
        for &i in used {
            if !order.contains(&i) {
                order.push(i);
            }
        }
        order.append(&mut recent);
        let mut held = 0u64;
        let mut kept = 0usize;
        for (n, &i) in order.iter().enumerate() {
            let b = bytes.get(i).copied().unwrap_or(0);
            if n > 0 && held.saturating_add(b) > self.capacity {
                break;
            }
            held = held.saturating_add(b);
            kept = n + 1;
        }
        let mut evicted = order.split_off(kept);
        evicted.reverse();
        *recent = order;
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::SmallCache;

    #[test]
    fn keeps_the_most_recently_read_databases_that_fit() {
        let bytes = [10, 10, 10, 25];
        let cache = SmallCache::new(25);
        assert!(cache.read(&[0], &bytes).is_empty());
        assert!(cache.read(&[1], &bytes).is_empty());
        // Three of ten bytes do not fit 25: the least recently read goes.
        assert_eq!(cache.read(&[2], &bytes), vec![0]);
        // Reading 1 again makes 2 the least recent.
        assert!(cache.read(&[1], &bytes).is_empty());
        assert_eq!(cache.read(&[0], &bytes), vec![2]);
        // A database as large as the capacity is kept alone.
        assert_eq!(cache.read(&[3], &bytes), vec![1, 0]);
        // A batch of two databases keeps both when they fit.
        assert_eq!(cache.read(&[0, 1], &bytes), vec![3]);
        assert!(cache.read(&[1, 0, 1], &bytes).is_empty());
    }

    #[test]
    fn a_database_larger_than_the_capacity_is_kept_alone() {
        let cache = SmallCache::new(5);
        assert!(cache.read(&[0], &[10, 1]).is_empty());
        assert_eq!(cache.read(&[1], &[10, 1]), vec![0]);
    }
}
