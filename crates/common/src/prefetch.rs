//! A software prefetch hint: the sampler's reads are scattered over
//! memory-mapped arrays (the graph's CSR and per-row arrays in the BFS,
//! column cells in assembly), and
//! issuing the loads of the next items before they are needed overlaps
//! their cache misses instead of taking them one after another.

/// Ask the CPU to start loading the cache line holding `s[i]` (a hint:
/// nothing when `i` is out of range, and nothing on other architectures).
#[inline]
pub fn prefetch<T>(s: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = s.get(i) {
        // SAFETY: prefetch is a hint that never faults; the address is
        // inside a live slice anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                std::ptr::from_ref(x).cast(),
                std::arch::x86_64::_MM_HINT_T0,
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, i);
}
