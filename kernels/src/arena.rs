//! Weight bytes in transparent huge pages. Decoding streams every weight once per token
//! (96–260 MB for the catalog models); in 4 KiB pages that is tens of thousands of TLB
//! misses per token, and most Linux hosts only give huge pages to memory that asks
//! (`transparent_hugepage=madvise`). So a loaded model's matrices move into one mapping
//! advised `MADV_HUGEPAGE` before it is written: SmolLM2's decoding read 116–124 → 140–158
//! tok/s with huge pages on this host (measured by switching THP to `always`). Where the
//! mapping or the advice is refused, or off Linux, the matrices keep their own buffers.

#![allow(unsafe_code)] // one anonymous mapping, written once, then only read.

use std::ops::{Deref, Range};
use std::sync::Arc;

/// A matrix's packed bytes: its own buffer, or a range of a model's shared mapping.
#[derive(Clone)]
pub(crate) enum Bytes {
    Owned(Vec<u8>),
    Shared(Arc<Arena>, Range<usize>),
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Owned(bytes) => bytes,
            Bytes::Shared(arena, range) => &arena.bytes()[range.clone()],
        }
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bytes::Owned(bytes) => write!(f, "Owned({} bytes)", bytes.len()),
            Bytes::Shared(_, range) => write!(f, "Shared({range:?})"),
        }
    }
}

/// Moves every buffer in `buffers` into one huge-page mapping (each start aligned to a
/// cache line). Returns whether it did; on `false` nothing changed.
pub(crate) fn pack(buffers: &mut [&mut Bytes]) -> bool {
    let mut ranges = Vec::with_capacity(buffers.len());
    let mut total = 0usize;
    for bytes in buffers.iter() {
        let start = total.next_multiple_of(64);
        total = start + bytes.len();
        ranges.push(start..total);
    }
    let Some(mut arena) = Arena::map(total) else {
        return false;
    };
    let target = arena.bytes_mut();
    for (bytes, range) in buffers.iter().zip(&ranges) {
        target[range.clone()].copy_from_slice(bytes);
    }
    let arena = Arc::new(arena);
    for (bytes, range) in buffers.iter_mut().zip(ranges) {
        **bytes = Bytes::Shared(Arc::clone(&arena), range);
    }
    true
}

/// One anonymous mapping whose 2 MiB-aligned body was advised `MADV_HUGEPAGE` before
/// any byte of it was touched.
pub(crate) struct Arena {
    mapping: *mut u8,
    mapped: usize,
    body: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by the arena; after `pack` writes it (through `&mut`),
// it is only read, through shared references.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

const HUGE_PAGE: usize = 2 << 20;

impl Arena {
    #[cfg(target_os = "linux")]
    fn map(len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let body_len = len.next_multiple_of(HUGE_PAGE);
        let mapped = body_len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; its result is checked.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return None;
        }
        let mapping = mapping.cast::<u8>();
        let offset = (mapping as usize).next_multiple_of(HUGE_PAGE) - mapping as usize;
        // SAFETY: offset < HUGE_PAGE, so the body lies inside the mapping.
        let body = unsafe { mapping.add(offset) };
        let arena = Arena {
            mapping,
            mapped,
            body,
            len,
        };
        // SAFETY: advice on a range of our own mapping; a refusal (a kernel without
        // THP) leaves ordinary pages, so the arena is not worth it: unmapped by drop.
        let advised = unsafe { libc::madvise(body.cast(), body_len, libc::MADV_HUGEPAGE) };
        (advised == 0).then_some(arena)
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_len: usize) -> Option<Self> {
        None
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes of the body are mapped (zero-filled until written).
        unsafe { std::slice::from_raw_parts(self.body, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.body, self.len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: unmaps exactly the mapping `map` made; no reference outlives the arena
        // (every `Bytes::Shared` holds it by `Arc`).
        unsafe {
            libc::munmap(self.mapping.cast(), self.mapped);
        }
        let _ = (self.mapping, self.mapped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_buffers_keep_their_bytes() {
        let mut a = Bytes::Owned((0..200u8).collect());
        let mut b = Bytes::Owned(vec![7; 3 << 20]);
        let mut c = Bytes::Owned(Vec::new());
        let want: Vec<Vec<u8>> = [&a, &b, &c].iter().map(|x| x.to_vec()).collect();
        let packed = pack(&mut [&mut a, &mut b, &mut c]);
        assert_eq!(packed, cfg!(target_os = "linux"));
        for (got, want) in [&a, &b, &c].iter().zip(&want) {
            assert_eq!(&got[..], &want[..]);
        }
        if packed {
            assert!(matches!(b, Bytes::Shared(..)));
            // Each buffer starts on a cache line.
            assert_eq!(b.as_ptr() as usize % 64, 0);
        }
    }
}
