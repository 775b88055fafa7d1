//! Give freed heap memory back to the system — a fenced module with `unsafe` (one call).
//! glibc keeps what a program frees for its next allocations; after a flood of DNS answers
//! expired (thousands of small entries freed at once), most of it sits in the middle of the
//! heap, where glibc does not return it by itself. `malloc_trim` releases the free pages.
//! Elsewhere (another C library) it does nothing.
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

/// Release free heap pages to the system.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a padding size and only walks glibc's own free lists; it has
    // no preconditions on the caller and is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}
