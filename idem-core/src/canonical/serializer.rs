//! The serializer: values, arrays and objects, written in canonical order.

use std::cmp::Ordering;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser;

use super::*;

// The serializer.

/// serde_json's private struct names for `RawValue` and (with `arbitrary_precision`) `Number`:
/// a one-field struct whose field is the JSON text.
pub(super) const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";
pub(super) const NUMBER_TOKEN: &str = "$serde_json::private::Number";

pub(super) struct Canon<'o> {
    pub(super) out: &'o mut Vec<u8>,
    pub(super) bufs: Buffers,
    /// Open arrays and objects: a Serialize impl that abandons one is caught at the end.
    pub(super) depth: usize,
    /// Open `[` and `{` in the output (enum variants' wrapping objects included): the JSON
    /// nesting that [`crate::limits::MAX_DEPTH`] bounds, as serde_json's parser counts it.
    pub(super) nest: usize,
    /// Values being written that write nothing of their own (`Some`, newtype structs): bounded
    /// too, so a recursive type cannot recurse without limit while writing only `null`.
    pub(super) wrappers: usize,
    /// `Some`s written as `null`, which JSON cannot tell from `None`.
    pub(super) some_nulls: usize,
    /// Whether a whole float (`5.0`) was written: as `5`, which an integer writes too.
    pub(super) whole_floats: bool,
    /// Whether a hash set is refused ([`unordered_seq`]): writing an intent, whose key must be
    /// the same for every copy of the same arguments.
    pub(super) refuse_sets: bool,
    /// Whether a `Some` written as `null` is written as [`SOME_NULL_MARK`] instead, to find
    /// where the value holds one ([`super::some_null_paths`]).
    pub(super) mark_some_nulls: bool,
}

/// What a `Some` written as `null` is written as when they are marked: a string no JSON text
/// is likely to hold. One that does is only asked about as well.
pub(crate) const SOME_NULL_MARK: &str = "\u{0}idem:Some(null)\u{0}";

/// Whether a sequence of type `name` (`std::any::type_name` of what `collect_seq` was given)
/// lists its elements in an order that differs between two copies of one value: the standard
/// library's and hashbrown's hash sets and maps, and their iterators, each seeded with a hasher
/// of its own, also behind the standard iterator adapters (`set.iter().map(..)`, which is how
/// a map is written as a list of pairs). Only the outermost collection counts: a `Vec` of sets
/// is in order, its sets are not.
pub(super) fn unordered_seq(name: &str) -> bool {
    let mut name = name;
    // Each adapter is one level of the name; a name deeper than this is not an adapter chain.
    for _ in 0..16 {
        let trimmed = name.trim_start_matches('&');
        let outer = trimmed.split('<').next().unwrap_or(trimmed);
        if outer.starts_with("std::collections::hash::") || outer.starts_with("hashbrown::") {
            return true;
        }
        if !outer.starts_with("core::iter::adapters::") {
            return false;
        }
        // The adapter's first type argument is the iterator it adapts.
        let Some(args) = trimmed.get(outer.len() + 1..) else { return false };
        name = first_type_argument(args);
    }
    false
}

/// The first of the comma-separated type arguments at the start of `args` (what follows `<`).
fn first_type_argument(args: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in args.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth == 0 => return args.get(..i).unwrap_or(args),
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => return args.get(..i).unwrap_or(args),
            _ => {}
        }
    }
    args
}

impl<'o> Canon<'o> {
    /// One more level of JSON nesting, refused past the limit (the caller writes the bracket).
    pub(super) fn enter(&mut self) -> Result<(), Fail> {
        if self.nest >= crate::limits::MAX_DEPTH {
            return Err(Fail::new(Kind::TooDeep));
        }
        self.nest += 1;
        Ok(())
    }
    pub(super) fn leave(&mut self, levels: usize) {
        self.nest = self.nest.saturating_sub(levels);
    }
    /// Writes a wrapper's inner value, refused past the wrapper limit.
    pub(super) fn wrapped<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        if self.wrappers >= crate::limits::MAX_WRAPPERS {
            return Err(Fail::new(Kind::TooDeep));
        }
        self.wrappers += 1;
        let result = value.serialize(&mut *self);
        self.wrappers -= 1;
        result
    }
    pub(super) fn open_variant(&mut self, variant: &'static str) -> Result<(), Fail> {
        self.enter()?;
        self.out.push(b'{');
        write_str(self.out, variant.as_bytes());
        self.out.push(b':');
        Ok(())
    }
    pub(super) fn seq(&mut self, variant: Option<&'static str>) -> Result<Seq<'_, 'o>, Fail> {
        if let Some(v) = variant {
            self.open_variant(v)?;
        }
        if let Err(e) = self.enter() {
            self.leave(usize::from(variant.is_some()));
            return Err(e.in_variant(variant));
        }
        self.out.push(b'[');
        self.depth += 1;
        let depth = self.depth;
        Ok(Seq { ser: self, index: 0, variant, depth })
    }
    pub(super) fn object(&mut self, variant: Option<&'static str>) -> Result<Obj<'_, 'o>, Fail> {
        if let Some(v) = variant {
            self.open_variant(v)?;
        }
        if let Err(e) = self.enter() {
            self.leave(usize::from(variant.is_some()));
            return Err(e.in_variant(variant));
        }
        self.out.push(b'{');
        self.depth += 1;
        Ok(Obj {
            start: self.out.len(),
            base: self.bufs.members.len(),
            keys_base: self.bufs.keys.len(),
            sorted: true,
            pending: None,
            variant,
            depth: self.depth,
            ser: self,
        })
    }
    /// Writes a JSON number given as text (serde_json's `arbitrary_precision` Number, and the
    /// numbers of a `RawValue` when that feature is on) exactly as serde_json without the feature
    /// reads it: an integer within `u64` / `i64` exactly, anything else (a fraction, an exponent,
    /// a larger integer) as the nearest `f64`. So a feature another crate turns on changes no key.
    pub(super) fn number_text(&mut self, text: &str) -> Result<(), Fail> {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            // serde_json reads `-0` as the float -0.0, written `0` like the integer.
            if negative {
                if let Ok(v) = text.parse::<i64>() {
                    write_int(self.out, v);
                    return Ok(());
                }
            } else if let Ok(v) = digits.parse::<u64>() {
                write_int(self.out, v);
                return Ok(());
            }
        }
        match text.parse::<f64>() {
            Ok(v) => write_f64(self.out, v),
            Err(_) => Err(ser::Error::custom(format_args!("`{text}` is not a JSON number"))),
        }
    }
}

impl<'a, 'o> ser::Serializer for &'a mut Canon<'o> {
    type Ok = ();
    type Error = Fail;
    type SerializeSeq = Seq<'a, 'o>;
    type SerializeTuple = Seq<'a, 'o>;
    type SerializeTupleStruct = Seq<'a, 'o>;
    type SerializeTupleVariant = Seq<'a, 'o>;
    type SerializeMap = Obj<'a, 'o>;
    type SerializeStruct = Struct<'a, 'o>;
    type SerializeStructVariant = Obj<'a, 'o>;

    fn serialize_bool(self, v: bool) -> Result<(), Fail> {
        self.out.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Fail> {
        // Exact widening, as JavaScript (and serde_json::Value) would hold the number.
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Fail> {
        self.whole_floats |= v.fract() == 0.0;
        write_f64(self.out, v)
    }
    fn serialize_char(self, v: char) -> Result<(), Fail> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Fail> {
        write_str(self.out, v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Fail> {
        // As serde_json: an array of numbers.
        self.out.push(b'[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            write_int(self.out, *b);
        }
        self.out.push(b']');
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Fail> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Fail> {
        let at = self.out.len();
        self.wrapped(value)?;
        if self.out.get(at..) == Some(b"null") {
            self.some_nulls += 1;
            if self.mark_some_nulls {
                self.out.truncate(at);
                write_str(self.out, SOME_NULL_MARK.as_bytes());
            }
        }
        Ok(())
    }
    fn serialize_unit(self) -> Result<(), Fail> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Fail> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Fail> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        self.wrapped(value)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        self.open_variant(variant)?;
        value.serialize(&mut *self).map_err(|e| e.in_variant(Some(variant)))?;
        self.leave(1);
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(None)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(None)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(None)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(Some(variant))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Obj<'a, 'o>, Fail> {
        self.object(None)
    }
    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Struct<'a, 'o>, Fail> {
        Ok(match name {
            RAW_VALUE_TOKEN => Struct::Raw(self),
            NUMBER_TOKEN => Struct::Number(self),
            _ => Struct::Obj(self.object(None)?),
        })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Obj<'a, 'o>, Fail> {
        self.object(Some(variant))
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Fail> {
        self.out.push(b'"');
        write!(Escaping(self.out), "{value}").map_err(ser::Error::custom)?;
        self.out.push(b'"');
        Ok(())
    }
    /// Sequences (`Vec`, slices, sets) arrive here with their type: a hash set, which lists its
    /// members in another order in every copy, is refused in an intent (its key would differ
    /// from copy to copy); everything else is written in the order it lists its elements, as
    /// serde's own `collect_seq` does.
    fn collect_seq<I>(self, iter: I) -> Result<(), Fail>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        if self.refuse_sets && unordered_seq(std::any::type_name::<I>()) {
            return Err(Fail::new(Kind::UnorderedSet));
        }
        let mut seq = self.seq(None)?;
        for item in iter {
            seq.element(&item)?;
        }
        seq.finish()
    }
}

/// An array: sequences, tuples, tuple structs and tuple variants.
pub(super) struct Seq<'a, 'o> {
    pub(super) ser: &'a mut Canon<'o>,
    pub(super) index: usize,
    pub(super) variant: Option<&'static str>,
    pub(super) depth: usize,
}

impl Seq<'_, '_> {
    pub(super) fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        if self.index > 0 {
            self.ser.out.push(b',');
        }
        value
            .serialize(&mut *self.ser)
            .map_err(|e| e.at(Seg::Index(self.index)).in_variant(self.variant))?;
        self.index += 1;
        Ok(())
    }
    pub(super) fn finish(self) -> Result<(), Fail> {
        if self.ser.depth != self.depth {
            return Err(unfinished());
        }
        self.ser.depth -= 1;
        self.ser.leave(1 + usize::from(self.variant.is_some()));
        self.ser.out.push(b']');
        if self.variant.is_some() {
            self.ser.out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeTuple for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

/// An object: maps, structs and struct variants. Members are written in arrival order and
/// reordered in `finish` when needed.
pub(super) struct Obj<'a, 'o> {
    pub(super) ser: &'a mut Canon<'o>,
    /// Output offset just after `{`.
    pub(super) start: usize,
    /// This object's first entry in `Buffers::members`.
    pub(super) base: usize,
    /// This object's first byte in `Buffers::keys`.
    pub(super) keys_base: usize,
    /// Whether the members so far arrived in strictly increasing key order.
    pub(super) sorted: bool,
    /// A map key written, waiting for its value: the key and the member's start.
    pub(super) pending: Option<(KeyRef, usize)>,
    pub(super) variant: Option<&'static str>,
    pub(super) depth: usize,
}

impl Obj<'_, '_> {
    /// Starts a member: the separating comma, then returns where the member begins.
    pub(super) fn open_member(&mut self) -> usize {
        if self.ser.bufs.members.len() > self.base {
            self.ser.out.push(b',');
        }
        self.ser.out.len()
    }
    pub(super) fn push(&mut self, key: KeyRef, start: usize) {
        let bufs = &mut self.ser.bufs;
        if self.sorted
            && let Some(prev) = bufs.members.last().filter(|_| bufs.members.len() > self.base)
        {
            self.sorted = cmp_utf16(bufs.key(prev.key), bufs.key(key)) == Ordering::Less;
        }
        bufs.members.push(Member { key, start, end: self.ser.out.len() });
    }
    pub(super) fn field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        let start = self.open_member();
        write_str(self.ser.out, key.as_bytes());
        self.ser.out.push(b':');
        value
            .serialize(&mut *self.ser)
            .map_err(|e| e.at(Seg::Key(key.to_owned())).in_variant(self.variant))?;
        self.push(KeyRef::Static(key), start);
        Ok(())
    }
    pub(super) fn fail(&self, kind: Kind) -> Fail {
        Fail::new(kind).in_variant(self.variant)
    }
    pub(super) fn finish(self) -> Result<(), Fail> {
        if self.ser.depth != self.depth || self.pending.is_some() {
            return Err(unfinished());
        }
        self.ser.depth -= 1;
        self.ser.leave(1 + usize::from(self.variant.is_some()));
        let Canon { out, bufs, .. } = &mut *self.ser;
        let Buffers { keys, members, scratch } = bufs;
        let mine = members.get_mut(self.base..).unwrap_or_default();
        if !self.sorted {
            mine.sort_unstable_by(|a, b| cmp_utf16(key_bytes(keys, a.key), key_bytes(keys, b.key)));
            if let Some(pair) =
                mine.windows(2).find(|w| key_bytes(keys, w[0].key) == key_bytes(keys, w[1].key))
            {
                let name = String::from_utf8_lossy(key_bytes(keys, pair[0].key)).into_owned();
                return Err(Fail::new(Kind::DuplicateKey)
                    .at(Seg::Key(name))
                    .in_variant(self.variant));
            }
            scratch.clear();
            scratch.extend_from_slice(out.get(self.start..).unwrap_or_default());
            out.truncate(self.start);
            for (i, m) in mine.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let span = scratch
                    .get(m.start.saturating_sub(self.start)..m.end.saturating_sub(self.start));
                out.extend_from_slice(span.unwrap_or_default());
            }
        }
        members.truncate(self.base);
        keys.truncate(self.keys_base);
        out.push(b'}');
        if self.variant.is_some() {
            out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Obj<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Fail> {
        if self.pending.is_some() {
            return Err(self.fail(Kind::Custom("a map key was given twice in a row".to_owned())));
        }
        let start = self.open_member();
        let from = self.ser.bufs.keys.len();
        key.serialize(KeySer(&mut self.ser.bufs.keys)).map_err(|e| e.in_variant(self.variant))?;
        let to = self.ser.bufs.keys.len();
        write_str(self.ser.out, self.ser.bufs.keys.get(from..to).unwrap_or_default());
        self.ser.out.push(b':');
        self.pending = Some((KeyRef::Buf(from, to), start));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        let Some((key, start)) = self.pending.take() else {
            return Err(self.fail(Kind::Custom("a map value came without its key".to_owned())));
        };
        if let Err(e) = value.serialize(&mut *self.ser) {
            let name = String::from_utf8_lossy(self.ser.bufs.key(key)).into_owned();
            return Err(e.at(Seg::Key(name)).in_variant(self.variant));
        }
        self.push(key, start);
        Ok(())
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Obj<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        self.field(key, value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

/// A struct, or one of serde_json's private one-field structs that carry JSON text.
pub(super) enum Struct<'a, 'o> {
    Obj(Obj<'a, 'o>),
    Raw(&'a mut Canon<'o>),
    Number(&'a mut Canon<'o>),
}

/// The JSON text inside a serde_json private struct's field (a string).
pub(super) fn json_text<T: Serialize + ?Sized>(value: &T) -> Result<String, Fail> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => Ok(s),
        Ok(_) => Err(ser::Error::custom("serde_json's private JSON text is not a string")),
        Err(e) => Err(ser::Error::custom(e)),
    }
}

impl ser::SerializeStruct for Struct<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        match self {
            Struct::Obj(obj) => obj.field(key, value),
            Struct::Raw(ser) => {
                // Parsed like any JSON arguments (a name given twice is refused: a `Value`
                // would keep the last, and the key would not be the text's), then
                // canonicalised like a serde_json::Value.
                let text = json_text(value)?;
                let parsed = crate::json_text::parse_unique(&text).map_err(|e| match e {
                    crate::json_text::JsonTextError::DuplicateMember { path, member } => {
                        let fail = Fail::new(Kind::DuplicateKey).at(Seg::Key(member));
                        if path == "." { fail } else { fail.at(Seg::Text(path)) }
                    }
                    crate::json_text::JsonTextError::Syntax(e) => {
                        ser::Error::custom(format_args!("invalid raw JSON: {e}"))
                    }
                })?;
                // Its numbers are read as serde_json reads them (beyond 64-bit integers, the
                // nearest float), while the tool reads their digits: one that is not exactly
                // what the canonical form writes is refused, so two numbers never share a key.
                if let Some(number) = inexact_number(&text) {
                    return Err(Fail::new(Kind::InexactNumber(number.to_owned())));
                }
                parsed.serialize(&mut **ser)
            }
            Struct::Number(ser) => ser.number_text(&json_text(value)?),
        }
    }
    fn skip_field(&mut self, _key: &'static str) -> Result<(), Fail> {
        Ok(())
    }
    fn end(self) -> Result<(), Fail> {
        match self {
            Struct::Obj(obj) => obj.finish(),
            Struct::Raw(_) | Struct::Number(_) => Ok(()),
        }
    }
}
