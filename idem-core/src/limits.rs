//! How deep the data idem walks may nest (`docs/key-spec.md`, "Limits").
//!
//! Every walk over data a caller or a model controls is recursive in serde: canonicalising and
//! parsing arguments, serializing an output, decoding a stored outcome. Each is bounded by the
//! one limit here, checked before the walk or while it goes, so deep data is refused with
//! [`KeyError::TooDeep`] long before a thread's stack runs out (2 MiB for a spawned
//! `std::thread`, in debug builds too).

use serde_json::Value;

use crate::canonical::{KeyError, PathText};

/// The deepest nesting of arrays and objects idem accepts: 127 levels (`[[1]]` is 2).
///
/// It is the most serde_json's parser reads back from text (it refuses 128 levels, "recursion
/// limit exceeded"), so every argument that passes could have been sent as JSON text, and every
/// output that passes reads back from its stored text. An enum variant's wrapping object
/// (`{"Charge":{..}}`) is one level, as in the JSON.
pub const MAX_DEPTH: usize = 127;

/// The longest chain of values that write nothing of their own (`Some`, `Box`, newtype structs)
/// along one path. Only a recursive Rust type built in code reaches it; it keeps such a value
/// from recursing without limit while writing only `null`.
pub const MAX_WRAPPERS: usize = 4 * MAX_DEPTH;

/// Checks, without recursion, that `value` nests arrays and objects at most [`MAX_DEPTH`]
/// levels deep. Errors: [`KeyError::TooDeep`] naming the first container past the limit
/// (`a[0][0]…`, shortened when long).
pub fn check_value_depth(value: &Value) -> Result<(), KeyError> {
    check_value_depth_within(value, MAX_DEPTH)
}

/// [`check_value_depth`] against `limit` levels: for a value that a message nests inside
/// containers of its own, which count against a reader's limit too.
pub(crate) fn check_value_depth_within(value: &Value, limit: usize) -> Result<(), KeyError> {
    enum Frame<'a> {
        Array(std::iter::Enumerate<std::slice::Iter<'a, Value>>, usize),
        Object(serde_json::map::Iter<'a>, &'a str),
    }
    fn children(v: &Value) -> Option<Frame<'_>> {
        match v {
            Value::Array(items) => Some(Frame::Array(items.iter().enumerate(), 0)),
            Value::Object(members) => Some(Frame::Object(members.iter(), "")),
            _ => None,
        }
    }
    let Some(root) = children(value) else { return Ok(()) };
    let mut stack = vec![root];
    while let Some(top) = stack.last_mut() {
        let next = match top {
            Frame::Array(items, at) => items.next().map(|(i, v)| {
                *at = i;
                v
            }),
            Frame::Object(members, at) => members.next().map(|(k, v)| {
                *at = k.as_str();
                v
            }),
        };
        let Some(child) = next else {
            stack.pop();
            continue;
        };
        let Some(frame) = children(child) else { continue };
        if stack.len() >= limit {
            let mut path = PathText::default();
            for f in &stack {
                match f {
                    Frame::Array(_, i) => path.index(*i),
                    Frame::Object(_, k) => path.key(k),
                }
            }
            return Err(KeyError::TooDeep { path: path.finish(), limit });
        }
        stack.push(frame);
    }
    Ok(())
}

/// Checks that `value` nests at most [`MAX_DEPTH`] levels (and [`MAX_WRAPPERS`]), before
/// serde_json (which has no limit when writing) or a `Value` conversion walks it: the value is
/// written as canonical JSON into a scratch buffer, a walk that stops at the limit. Only depth is
/// judged; any other error is left to the serializer that follows.
///
/// Errors: [`KeyError::TooDeep`].
pub fn check_depth<T: serde::Serialize + ?Sized>(value: &T) -> Result<(), KeyError> {
    thread_local! {
        static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut scratch = SCRATCH.try_with(std::cell::Cell::take).unwrap_or_default();
    // Not an intent: a hash set is written, not refused, so the walk goes on to the depth.
    let result = crate::canonical::canonicalize_counting(value, &mut scratch).map(drop);
    if scratch.capacity() <= 64 * 1024 {
        scratch.clear();
        let _ = SCRATCH.try_with(|s| s.set(scratch));
    }
    match result {
        Err(e @ KeyError::TooDeep { .. }) => Err(e),
        _ => Ok(()),
    }
}

/// A `Value` of `depth` nested arrays around `inner`, built and taken apart without recursion:
/// for tests of the limits, which must neither build nor drop deep data recursively.
#[doc(hidden)]
pub fn nested_arrays(depth: usize, inner: Value) -> Value {
    let mut v = inner;
    for _ in 0..depth {
        v = Value::Array(vec![v]);
    }
    v
}

/// Drops `value` without recursion (serde_json's `Value` drops recursively: a value nested
/// 100,000 levels deep would overflow the stack of the thread that drops it).
#[doc(hidden)]
pub fn drop_flat(value: Value) {
    let mut pending = vec![value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Array(items) => pending.extend(items),
            Value::Object(members) => pending.extend(members.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_up_to_the_limit_pass_and_deeper_ones_name_their_path() {
        let at = nested_arrays(MAX_DEPTH, json!(1));
        assert_eq!(check_value_depth(&at), Ok(()));
        drop_flat(at);
        let past = nested_arrays(MAX_DEPTH + 1, json!(1));
        match check_value_depth(&past) {
            Err(KeyError::TooDeep { path, limit }) => {
                assert_eq!(limit, MAX_DEPTH);
                assert!(path.starts_with("[0][0][0]"), "{path}");
                assert!(path.ends_with("levels)"), "{path}");
            }
            other => panic!("expected TooDeep, got {other:?}"),
        }
        drop_flat(past);
        let members = json!({"a": {"b c": [1, {"d": 2}]}});
        assert_eq!(check_value_depth(&members), Ok(()));
    }

    #[test]
    fn the_path_goes_through_object_members() {
        let mut v = nested_arrays(MAX_DEPTH - 1, json!({}));
        v = json!({"meta": {"x": 1, "tree": v}});
        match check_value_depth(&v) {
            Err(KeyError::TooDeep { path, .. }) => {
                assert!(path.starts_with("meta.tree[0][0]"), "{path}")
            }
            other => panic!("expected TooDeep, got {other:?}"),
        }
        drop_flat(v);
    }

    #[test]
    fn json_text_and_values_agree_on_the_limit() {
        let text = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert!(serde_json::from_str::<Value>(&text(MAX_DEPTH)).is_ok());
        assert!(serde_json::from_str::<Value>(&text(MAX_DEPTH + 1)).is_err());
    }
}
