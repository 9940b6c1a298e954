//! The buffers one thread reuses across calls, and the order of object members.

use std::cell::Cell;
use std::cmp::Ordering;

// Buffers reused across calls on one thread. A nested `canonicalize` (from inside a Serialize
// impl) finds the cell empty and allocates its own.

#[derive(Default)]
pub(super) struct Buffers {
    /// Raw (unescaped) UTF-8 names of map members in the open objects.
    pub(super) keys: Vec<u8>,
    /// Members of the open objects, innermost last.
    pub(super) members: Vec<Member>,
    /// Holds an object's bytes while they are written back in order.
    pub(super) scratch: Vec<u8>,
}

/// Buffers larger than this are dropped after use instead of kept for the next call.
pub(super) const KEEP_BYTES: usize = 64 * 1024;
pub(super) const KEEP_MEMBERS: usize = 1024;

thread_local! {
    static POOL: Cell<Option<Buffers>> = const { Cell::new(None) };
}

impl Buffers {
    pub(super) fn take() -> Buffers {
        POOL.try_with(Cell::take).ok().flatten().unwrap_or_default()
    }
    pub(super) fn give_back(mut self) {
        if self.keys.capacity() + self.scratch.capacity() > KEEP_BYTES
            || self.members.capacity() > KEEP_MEMBERS
        {
            return;
        }
        self.keys.clear();
        self.members.clear();
        self.scratch.clear();
        let _ = POOL.try_with(|p| p.set(Some(self)));
    }
    pub(super) fn key(&self, key: KeyRef) -> &[u8] {
        key_bytes(&self.keys, key)
    }
}

#[derive(Clone, Copy)]
pub(super) enum KeyRef {
    /// A struct field name.
    Static(&'static str),
    /// A map key, as a range of `Buffers::keys`.
    Buf(usize, usize),
}

pub(super) fn key_bytes(keys: &[u8], key: KeyRef) -> &[u8] {
    match key {
        KeyRef::Static(s) => s.as_bytes(),
        KeyRef::Buf(a, b) => keys.get(a..b).unwrap_or_default(),
    }
}

/// One object member: its name and the span of `"name":value` in the output.
#[derive(Clone, Copy)]
pub(super) struct Member {
    pub(super) key: KeyRef,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// Compares two UTF-8 strings by their UTF-16 code units (RFC 8785 §3.2.3) without decoding.
///
/// UTF-8 byte order is code point order, and so is UTF-16 order except where a character in
/// U+E000..=U+FFFF (lead byte 0xEE or 0xEF) meets a supplementary character (lead byte 0xF0..=0xF4),
/// which UTF-16 writes as surrogates 0xD800..=0xDFFF, below 0xE000. Equal prefixes keep
/// character boundaries aligned, so the first differing bytes are both lead bytes or both
/// continuation bytes (0x80..=0xBF, never in the exceptional range).
pub(super) fn cmp_utf16(a: &[u8], b: &[u8]) -> Ordering {
    for (&x, &y) in a.iter().zip(b) {
        if x != y {
            let exceptional = x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0);
            return if exceptional { y.cmp(&x) } else { x.cmp(&y) };
        }
    }
    a.len().cmp(&b.len())
}
