//! Map keys: strings as they are, integers as their decimal text and booleans as `true` and
//! `false` (as serde_json writes and reads them); anything else has no unambiguous string form.

use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser::{self, Impossible};

use super::*;

pub(super) struct KeySer<'k>(pub(super) &'k mut Vec<u8>);

pub(super) fn non_string_key<T>() -> Result<T, Fail> {
    Err(Fail::new(Kind::NonStringKey))
}

macro_rules! int_keys {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, v: $t) -> Result<(), Fail> {
            write_int(self.0, v);
            Ok(())
        }
    )*};
}

impl ser::Serializer for KeySer<'_> {
    type Ok = ();
    type Error = Fail;
    type SerializeSeq = Impossible<(), Fail>;
    type SerializeTuple = Impossible<(), Fail>;
    type SerializeTupleStruct = Impossible<(), Fail>;
    type SerializeTupleVariant = Impossible<(), Fail>;
    type SerializeMap = Impossible<(), Fail>;
    type SerializeStruct = Impossible<(), Fail>;
    type SerializeStructVariant = Impossible<(), Fail>;

    int_keys!(
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128
    );

    fn serialize_str(self, v: &str) -> Result<(), Fail> {
        self.0.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Fail> {
        self.0.extend_from_slice(v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
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
        value.serialize(self)
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Fail> {
        write!(Bytes(self.0), "{value}").map_err(ser::Error::custom)
    }

    fn serialize_bool(self, v: bool) -> Result<(), Fail> {
        // A map's keys are of one type, so `true` as a key is never also the string "true".
        self.serialize_str(if v { "true" } else { "false" })
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_none(self) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_unit(self) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Fail> {
        non_string_key()
    }
    crate::canonical::refuse::refuse_compounds!(Fail, non_string_key());
}
