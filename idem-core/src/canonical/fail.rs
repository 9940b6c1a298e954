//! Errors inside the serializer, with the path of the value that failed.

use std::fmt::{self, Write as _};

use serde::ser;

use super::*;

// Errors inside the serializer: boxed so that `Result<(), Fail>` stays one word on the hot path;
// the path is collected innermost first while the error travels up, so the success path pays
// nothing for it.

pub(super) struct Fail(pub(super) Box<FailInner>);

pub(super) struct FailInner {
    pub(super) kind: Kind,
    pub(super) path: Vec<Seg>,
}

pub(super) enum Kind {
    NonFinite(&'static str),
    NonStringKey,
    DuplicateKey,
    TooDeep,
    UnorderedSet,
    InexactNumber(String),
    Custom(String),
}

pub(super) enum Seg {
    Key(String),
    Index(usize),
    /// A path inside a `RawValue`'s text, as [`crate::json_text`] writes it (`a[0].b`).
    Text(String),
}

impl Fail {
    pub(super) fn new(kind: Kind) -> Self {
        Fail(Box::new(FailInner { kind, path: Vec::new() }))
    }
    pub(super) fn at(mut self, seg: Seg) -> Self {
        self.0.path.push(seg);
        self
    }
    pub(super) fn in_variant(self, variant: Option<&'static str>) -> Self {
        match variant {
            Some(v) => self.at(Seg::Key(v.to_owned())),
            None => self,
        }
    }
    pub(super) fn path(&self) -> String {
        let mut path = PathText::default();
        for seg in self.0.path.iter().rev() {
            match seg {
                Seg::Index(i) => path.index(*i),
                Seg::Key(k) => path.key(k),
                Seg::Text(t) => path.text(t),
            }
        }
        path.finish()
    }
    pub(super) fn into_key_error(self) -> KeyError {
        let path = self.path();
        match self.0.kind {
            Kind::NonFinite(value) => KeyError::NonFinite { path, value },
            Kind::NonStringKey => KeyError::NonStringKey { path },
            Kind::DuplicateKey => KeyError::DuplicateKey { path },
            Kind::TooDeep => KeyError::TooDeep { path, limit: crate::limits::MAX_DEPTH },
            Kind::UnorderedSet => KeyError::UnorderedSet { path },
            Kind::InexactNumber(number) => KeyError::InexactNumber { path, number },
            Kind::Custom(msg) if path.is_empty() => KeyError::Custom(msg),
            Kind::Custom(msg) => KeyError::Custom(format!("at `{path}`: {msg}")),
        }
    }
}

/// A path as errors show it (`items[2].price`, `meta["a.b"]`), built outermost first. Paths of
/// data nested past the depth limit are long: after [`PathText::MAX_CHARS`] bytes the rest is
/// counted, not written (`[0][0]…[0] … (+90 levels)`).
#[derive(Default)]
pub(crate) struct PathText {
    out: String,
    omitted: usize,
}

impl PathText {
    const MAX_CHARS: usize = 120;

    pub(super) fn full(&mut self) -> bool {
        if self.out.len() >= Self::MAX_CHARS {
            self.omitted += 1;
            return true;
        }
        false
    }
    pub(crate) fn index(&mut self, i: usize) {
        if !self.full() {
            let _ = write!(self.out, "[{i}]");
        }
    }
    pub(crate) fn key(&mut self, k: &str) {
        if self.full() {
            return;
        }
        if is_plain(k) {
            if !self.out.is_empty() {
                self.out.push('.');
            }
            self.out.push_str(k);
        } else {
            let mut quoted = Vec::with_capacity(k.len() + 2);
            write_str(&mut quoted, k.as_bytes());
            let _ = write!(self.out, "[{}]", String::from_utf8_lossy(&quoted));
        }
    }
    /// A path already written (`a[0].b`), below what the path holds so far.
    pub(crate) fn text(&mut self, t: &str) {
        if self.full() {
            return;
        }
        if !self.out.is_empty() && !t.starts_with('[') {
            self.out.push('.');
        }
        self.out.push_str(t);
    }
    pub(crate) fn finish(mut self) -> String {
        if self.omitted > 0 {
            let _ = write!(self.out, "… (+{} levels)", self.omitted);
        }
        self.out
    }
}

pub(super) fn is_plain(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(super) fn unfinished() -> Fail {
    Fail::new(Kind::Custom(
        "a Serialize implementation left a sequence or map unfinished".to_owned(),
    ))
}

impl fmt::Debug for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("canonical JSON error")
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            Kind::NonFinite(v) => write!(f, "{v} has no JSON form"),
            Kind::NonStringKey => {
                f.write_str("map key is neither a string, an integer nor a boolean")
            }
            Kind::DuplicateKey => f.write_str("duplicate object member"),
            Kind::TooDeep => f.write_str("nested too deep"),
            Kind::UnorderedSet => f.write_str("a hash set, whose order differs in every copy"),
            Kind::InexactNumber(n) => {
                write!(f, "the number {n} has more digits than a float keeps")
            }
            Kind::Custom(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Fail {}

impl ser::Error for Fail {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Fail::new(Kind::Custom(msg.to_string()))
    }
}
