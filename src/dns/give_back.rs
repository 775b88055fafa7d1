//! Give freed heap memory back to the system — a fenced module with `unsafe` (one call).
//! glibc keeps what a program frees for its next allocations; after a flood of DNS answers
//! expired (thousands of small entries freed at once), most of it sits in the middle of the
//! heap, where glibc does not return it by itself. `malloc_trim` releases the free pages.
//! Elsewhere (another C library) it does nothing.

/// Release free heap pages to the system.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a padding size and only walks glibc's own free lists; it has
    // no preconditions on the caller and is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}
