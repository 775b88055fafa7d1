//! The buffers a tunnel's young direction copies through ([`crate::relay::splice`]): 16 KiB,
//! taken for one chunk and given back when it is written. A short tunnel (a CONNECT, a 1-byte
//! echo each way, an end of stream) takes three (`benches/allocs_per_connect.sh`); each was a
//! `malloc` and a `free` of a size glibc serves from its bins, not its per-thread cache, and
//! every such request first merges the thread's fast bins. So each worker thread keeps a few
//! spare ones, last given first taken (still in its cache).
//!
//! A spare buffer still holds the bytes of the chunk it last carried, in its spare capacity.
//! They cannot reach another tunnel: a [`Chunk`] is empty when taken (`len` 0), a read
//! appends after `len`, and only what the read wrote is ever written on. An idle tunnel holds
//! no chunk (it waits for readiness before taking one), so the pool is bounded by the
//! threads, not the tunnels: [`SPARE`] a thread.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Bytes in a chunk buffer: the user-space phase's read size.
const SIZE: usize = 16 * 1024;

/// Spare buffers one thread keeps: 128 KiB. A worker copies a chunk for a handful of tunnels
/// at a time; more are freed as before.
const SPARE: usize = 8;

thread_local! {
    static SPARES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for [`SIZE`] bytes, given back to its thread's spares when dropped
/// (the thread it is dropped on: a task may move between workers).
pub(crate) struct Chunk(Vec<u8>);

impl Chunk {
    /// A spare buffer of this thread's, else a new one.
    pub(crate) fn take() -> Chunk {
        let spare = SPARES
            .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.pop()))
            .ok()
            .flatten();
        Chunk(spare.unwrap_or_else(|| Vec::with_capacity(SIZE)))
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        // A buffer that was grown or shrunk is not the pool's size: let it go.
        if buf.capacity() != SIZE {
            return;
        }
        buf.clear();
        // At thread exit the spares may be gone already: the buffer is then freed.
        let _ = SPARES.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                if s.len() < SPARE {
                    s.push(buf);
                }
            }
        });
    }
}

impl Deref for Chunk {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl DerefMut for Chunk {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_empty_when_taken_even_after_carrying_bytes() {
        let mut c = Chunk::take();
        c.extend_from_slice(b"secret of the last tunnel");
        let at = c.as_ptr();
        drop(c);
        let c = Chunk::take();
        // The same buffer comes back (this thread's spare), and it reads as empty.
        assert_eq!(c.as_ptr(), at);
        assert!(c.is_empty());
        assert_eq!(c.capacity(), SIZE);
    }

    #[test]
    fn a_thread_keeps_at_most_its_spares() {
        let taken: Vec<Chunk> = (0..SPARE + 4).map(|_| Chunk::take()).collect();
        drop(taken);
        let kept = SPARES.with(|s| s.borrow().len());
        assert_eq!(kept, SPARE);
    }

    #[test]
    fn a_buffer_grown_past_its_size_is_not_kept() {
        SPARES.with(|s| s.borrow_mut().clear());
        let mut c = Chunk::take();
        c.extend_from_slice(&[0u8; SIZE + 1]);
        drop(c);
        assert_eq!(SPARES.with(|s| s.borrow().len()), 0);
    }
}
