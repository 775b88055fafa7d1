//! Give freed heap memory back to the system — a fenced module with `unsafe` (one call).
//! glibc keeps what a program frees for its next allocations; after a flood of DNS answers
//! expired (thousands of small entries freed at once), most of it sits in the middle of the
//! heap, where glibc does not return it by itself. `malloc_trim` releases the free pages.
//! Elsewhere (another C library) it does nothing.
//!
//! `malloc_trim` alone was not enough ([`fix_thresholds`]): it gives back the free pages
//! inside each arena, but not the free top of a worker thread's arena, which glibc trims only
//! when a free reaches its *trim threshold* — and glibc raises that threshold to twice the
//! largest block it ever mapped and unmapped. A flood grows the answer tables past the
//! mapping threshold (128 KiB), their old tables are unmapped as they grow, and the threshold
//! ends at several MiB: the arena's free top stays resident. Measured on the flood of
//! `tests/dns_memory.rs` (12 MiB of answers): 15 % to 90 % given back from run to run
//! (`malloc_stats` showed the arenas' live bytes back at the start's, their mapped bytes
//! not); with both thresholds fixed, 97 % in each of three runs.
//!
//! Whoever drops DNS answers in bulk (the answer memory's sweep, each UDP loop's repeat
//! cache) counts them with [`freed`]; the sweep task calls [`release_if_many`], which trims
//! once enough was freed since the last trim — so answers that expire just after a trim are
//! given back at the next sweep, not kept until the next flood.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Entries freed since the last trim.
static FREED: AtomicUsize = AtomicUsize::new(0);
/// Freed entries worth a trim (a trim walks every arena: not for a handful).
const WORTH_A_TRIM: usize = 1024;

/// Count `n` DNS answers just dropped.
pub fn freed(n: usize) {
    if n > 0 {
        FREED.fetch_add(n, Ordering::Relaxed);
    }
}

/// Give the free pages back when many entries were dropped since the last time.
pub fn release_if_many() {
    if FREED.load(Ordering::Relaxed) >= WORTH_A_TRIM {
        FREED.store(0, Ordering::Relaxed);
        release_free_memory();
    }
}

/// A block at least this large is mapped on its own (returned whole when freed). Larger than
/// any buffer the proxy reuses per connection (hyper's read buffer stops at 408 KiB), so no
/// connection maps and unmaps one.
const MMAP_THRESHOLD: i32 = 512 * 1024;
/// A free top of an arena at least this large is given back when a free reaches it.
const TRIM_THRESHOLD: i32 = 256 * 1024;

/// Fix glibc's mapping and trim thresholds (no dynamic raise): called once at start, before
/// the runtime's threads exist.
pub fn fix_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets allocator parameters under the main arena's lock; it has no
    // preconditions on the caller, and these two take any non-negative size.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Release free heap pages to the system.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a padding size and only walks glibc's own free lists; it has
    // no preconditions on the caller and is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}
