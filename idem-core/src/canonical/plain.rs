//! The compact JSON text serde_json writes for a value (members in declaration order), written
//! with the canonical form's refusals: what either would refuse, or what this writer does not
//! write exactly as the canonical form reads it, stops the walk (`Stop`) and the caller takes the
//! full path (the canonical form, which says why).
//!
//! Stops at: a NaN or infinity; any `f32` (serde_json writes `0.1f32` and `0.1f64` alike, which
//! the canonical form tells apart); integers wider than 64 bits; map keys other than strings,
//! chars, unit variants and integers up to 64 bits; two members of one object with the same
//! name; nesting past [`crate::limits::MAX_DEPTH`] or wrappers past
//! [`crate::limits::MAX_WRAPPERS`] (counted as the canonical form counts them); serde_json's
//! private structs (`RawValue`, `Number`); any error of the value's `Serialize`.
//!
//! Within those rules the text determines the canonical form (members sorted, numbers rewritten),
//! so two values whose texts are equal have equal canonical forms.

use std::cell::Cell;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser::{self, Impossible};

use super::leaves::{Escaping, write_int, write_str};

/// Why the walk stopped; the full path says more.
#[derive(Debug)]
pub(crate) struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not written by the plain path")
    }
}

impl std::error::Error for Stop {}

impl ser::Error for Stop {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Stop
    }
}

thread_local! {
    /// Spans of the member names of the open objects, reused across calls on one thread.
    static NAMES: Cell<Vec<(usize, usize)>> = const { Cell::new(Vec::new()) };
}

/// Appends serde_json's compact text of `value` to `out`, or stops (then `out` is left as it
/// was). `check_names`: whether to refuse an object that names a member twice (a second walk
/// whose text is compared to a checked one need not). Returns how many `Some`s of a value
/// written as `null` it wrote: the text cannot tell them from `None`.
pub(crate) fn write_plain<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
    check_names: bool,
) -> Result<usize, Stop> {
    let mark = out.len();
    let mut names =
        if check_names { NAMES.try_with(Cell::take).unwrap_or_default() } else { Vec::new() };
    names.clear();
    let mut w = Plain { out, names: &mut names, check_names, nest: 0, wrappers: 0, some_nulls: 0 };
    let result = value.serialize(&mut w);
    let some_nulls = w.some_nulls;
    if check_names && names.capacity() <= 4096 {
        let _ = NAMES.try_with(|n| n.set(names));
    }
    if result.is_err() {
        out.truncate(mark);
    }
    result.map(|()| some_nulls)
}

struct Plain<'o> {
    out: &'o mut Vec<u8>,
    names: &'o mut Vec<(usize, usize)>,
    check_names: bool,
    /// Open `[` and `{`, as the canonical serializer counts them.
    nest: usize,
    /// `Some` and newtype structs being written.
    wrappers: usize,
    /// `Some`s written as `null`.
    some_nulls: usize,
}

impl<'o> Plain<'o> {
    fn enter(&mut self) -> Result<(), Stop> {
        if self.nest >= crate::limits::MAX_DEPTH {
            return Err(Stop);
        }
        self.nest += 1;
        Ok(())
    }
    fn wrapped<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        if self.wrappers >= crate::limits::MAX_WRAPPERS {
            return Err(Stop);
        }
        self.wrappers += 1;
        let result = value.serialize(&mut *self);
        self.wrappers -= 1;
        result
    }
    fn open_variant(&mut self, variant: &'static str) -> Result<(), Stop> {
        self.enter()?;
        self.out.push(b'{');
        write_str(self.out, variant.as_bytes());
        self.out.push(b':');
        Ok(())
    }
    fn compound(
        &mut self,
        variant: Option<&'static str>,
        open: u8,
    ) -> Result<Compound<'_, 'o>, Stop> {
        if let Some(v) = variant {
            self.open_variant(v)?;
        }
        self.enter()?;
        self.out.push(open);
        let base = self.names.len();
        Ok(Compound { w: self, first: true, variant: variant.is_some(), base })
    }
    /// A member's name and colon; a name seen before in this object stops the walk.
    fn name(
        &mut self,
        base: usize,
        first: bool,
        write: impl FnOnce(&mut Self) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        if !first {
            self.out.push(b',');
        }
        let start = self.out.len();
        write(self)?;
        let end = self.out.len();
        self.out.push(b':');
        if self.check_names {
            let name = &self.out[start..end];
            let seen = &self.names[base..];
            // Small objects are checked as they are written; larger ones once, sorted, at the end.
            if seen.len() < SMALL && seen.iter().any(|&(a, b)| &self.out[a..b] == name) {
                return Err(Stop);
            }
            self.names.push((start, end));
        }
        Ok(())
    }
}

/// Objects with fewer members are checked for a repeated name pairwise.
const SMALL: usize = 16;

impl<'a, 'o> ser::Serializer for &'a mut Plain<'o> {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Compound<'a, 'o>;
    type SerializeTuple = Compound<'a, 'o>;
    type SerializeTupleStruct = Compound<'a, 'o>;
    type SerializeTupleVariant = Compound<'a, 'o>;
    type SerializeMap = Compound<'a, 'o>;
    type SerializeStruct = Compound<'a, 'o>;
    type SerializeStructVariant = Compound<'a, 'o>;

    fn serialize_bool(self, v: bool) -> Result<(), Stop> {
        self.out.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i128(self, _v: i128) -> Result<(), Stop> {
        Err(Stop)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Stop> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u128(self, _v: u128) -> Result<(), Stop> {
        Err(Stop)
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Stop> {
        Err(Stop)
    }
    fn serialize_f64(self, v: f64) -> Result<(), Stop> {
        if !v.is_finite() {
            return Err(Stop);
        }
        // serde_json's own digits for the number.
        serde_json::to_writer(&mut *self.out, &v).map_err(|_| Stop)
    }
    fn serialize_char(self, v: char) -> Result<(), Stop> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Stop> {
        write_str(self.out, v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Stop> {
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
    fn serialize_none(self) -> Result<(), Stop> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Stop> {
        let at = self.out.len();
        self.wrapped(value)?;
        if self.out.get(at..) == Some(b"null") {
            self.some_nulls += 1;
        }
        Ok(())
    }
    fn serialize_unit(self) -> Result<(), Stop> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Stop> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Stop> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        self.wrapped(value)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        self.open_variant(variant)?;
        value.serialize(&mut *self)?;
        self.nest -= 1;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a, 'o>, Stop> {
        self.compound(None, b'[')
    }
    fn serialize_tuple(self, _len: usize) -> Result<Compound<'a, 'o>, Stop> {
        self.compound(None, b'[')
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'o>, Stop> {
        self.compound(None, b'[')
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'o>, Stop> {
        self.compound(Some(variant), b'[')
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a, 'o>, Stop> {
        self.compound(None, b'{')
    }
    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Compound<'a, 'o>, Stop> {
        // serde_json's RawValue and Number write their text as is: the full path knows them.
        if name.starts_with("$serde_json") {
            return Err(Stop);
        }
        self.compound(None, b'{')
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a, 'o>, Stop> {
        self.compound(Some(variant), b'{')
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Stop> {
        self.out.push(b'"');
        write!(Escaping(self.out), "{value}").map_err(|_| Stop)?;
        self.out.push(b'"');
        Ok(())
    }
}

/// An open array or object (a variant's wrapping object included).
pub(crate) struct Compound<'a, 'o> {
    w: &'a mut Plain<'o>,
    first: bool,
    variant: bool,
    /// Where this object's member names begin in `Plain::names`.
    base: usize,
}

impl Compound<'_, '_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        if !self.first {
            self.w.out.push(b',');
        }
        self.first = false;
        value.serialize(&mut *self.w)
    }
    fn member<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) -> Result<(), Stop> {
        let first = std::mem::replace(&mut self.first, false);
        self.w.name(self.base, first, |w| {
            write_str(w.out, name.as_bytes());
            Ok(())
        })?;
        value.serialize(&mut *self.w)
    }
    fn close(self, bracket: u8) -> Result<(), Stop> {
        let w = self.w;
        if w.check_names && w.names.len() - self.base >= SMALL {
            let out = &*w.out;
            let names = &mut w.names[self.base..];
            names.sort_unstable_by(|&(a, b), &(c, d)| out[a..b].cmp(&out[c..d]));
            if names.windows(2).any(|p| out[p[0].0..p[0].1] == out[p[1].0..p[1].1]) {
                return Err(Stop);
            }
        }
        w.names.truncate(self.base);
        w.out.push(bracket);
        w.nest -= 1;
        if self.variant {
            w.out.push(b'}');
            w.nest -= 1;
        }
        Ok(())
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.element(value)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b']')
    }
}

impl ser::SerializeTuple for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.element(value)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b']')
    }
}

impl ser::SerializeTupleStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.element(value)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b']')
    }
}

impl ser::SerializeTupleVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        self.element(value)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b']')
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Stop> {
        let first = std::mem::replace(&mut self.first, false);
        self.w.name(self.base, first, |w| key.serialize(KeyW(w)))
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Stop> {
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b'}')
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        self.member(key, value)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b'}')
    }
}

impl ser::SerializeStructVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Stop;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        self.member(key, value)
    }
    fn end(self) -> Result<(), Stop> {
        self.close(b'}')
    }
}

/// A map key: what both serde_json and the canonical form write as the same string.
struct KeyW<'a, 'o>(&'a mut Plain<'o>);

macro_rules! int_keys {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, v: $t) -> Result<(), Stop> {
            self.0.out.push(b'"');
            write_int(self.0.out, v);
            self.0.out.push(b'"');
            Ok(())
        }
    )*};
}

macro_rules! stop {
    ($($f:ident($($t:ty),*)),*) => {$(
        fn $f(self, $(_: $t),*) -> Result<(), Stop> {
            Err(Stop)
        }
    )*};
}

impl ser::Serializer for KeyW<'_, '_> {
    type Ok = ();
    type Error = Stop;
    type SerializeSeq = Impossible<(), Stop>;
    type SerializeTuple = Impossible<(), Stop>;
    type SerializeTupleStruct = Impossible<(), Stop>;
    type SerializeTupleVariant = Impossible<(), Stop>;
    type SerializeMap = Impossible<(), Stop>;
    type SerializeStruct = Impossible<(), Stop>;
    type SerializeStructVariant = Impossible<(), Stop>;

    int_keys!(
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_u8: u8, serialize_u16: u16, serialize_u32: u32, serialize_u64: u64
    );
    stop!(
        serialize_i128(i128),
        serialize_u128(u128),
        serialize_bool(bool),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str)
    );

    fn serialize_str(self, v: &str) -> Result<(), Stop> {
        write_str(self.0.out, v.as_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Stop> {
        write_str(self.0.out, v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Stop> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Stop> {
        if self.0.wrappers >= crate::limits::MAX_WRAPPERS {
            return Err(Stop);
        }
        self.0.wrappers += 1;
        let result = value.serialize(KeyW(&mut *self.0));
        self.0.wrappers -= 1;
        result
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Stop> {
        Err(Stop)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Stop> {
        Err(Stop)
    }
    crate::canonical::refuse::refuse_compounds!(Stop, Err(Stop));
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Stop> {
        self.0.out.push(b'"');
        write!(Escaping(self.0.out), "{value}").map_err(|_| Stop)?;
        self.0.out.push(b'"');
        Ok(())
    }
}
