//! Whether a value serializes as `None`, for parameters marked `#[idem(skip_if_none)]`: the
//! arguments are generic (`Args<(T1, .., Tn), F>`), so the question is asked through serde,
//! which every argument implements, instead of a trait only `Option` could have.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible, Serializer};

/// True when `value`'s `Serialize` writes `none` (an `Option` that is `None`); false for
/// anything else, without serializing the rest of the value.
pub(crate) fn is_none<T: Serialize + ?Sized>(value: &T) -> bool {
    matches!(value.serialize(NoneProbe), Ok(true))
}

struct NoneProbe;

/// "Not none": the probe stops at the first thing it sees that is not `none`.
#[derive(Debug)]
struct NotNone;

impl fmt::Display for NotNone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value other than none")
    }
}

impl std::error::Error for NotNone {}

impl ser::Error for NotNone {
    fn custom<M: fmt::Display>(_msg: M) -> Self {
        NotNone
    }
}

macro_rules! not_none {
    ($($method:ident($($ty:ty),*);)*) => {$(
        fn $method(self, $(_: $ty),*) -> Result<bool, NotNone> {
            Ok(false)
        }
    )*};
}

impl Serializer for NoneProbe {
    type Ok = bool;
    type Error = NotNone;
    type SerializeSeq = Impossible<bool, NotNone>;
    type SerializeTuple = Impossible<bool, NotNone>;
    type SerializeTupleStruct = Impossible<bool, NotNone>;
    type SerializeTupleVariant = Impossible<bool, NotNone>;
    type SerializeMap = Impossible<bool, NotNone>;
    type SerializeStruct = Impossible<bool, NotNone>;
    type SerializeStructVariant = Impossible<bool, NotNone>;

    fn serialize_none(self) -> Result<bool, NotNone> {
        Ok(true)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<bool, NotNone> {
        Ok(false)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _value: &T,
    ) -> Result<bool, NotNone> {
        Ok(false)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<bool, NotNone> {
        Ok(false)
    }

    not_none! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_i128(i128);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_u128(u128);
        serialize_f32(f32);
        serialize_f64(f64);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    // A compound value is not none: refusing it here ends the probe before any element.
    crate::canonical::refuse::refuse_compounds!(NotNone, Err(NotNone));
}

#[cfg(test)]
mod tests {
    use super::is_none;
    use std::collections::BTreeMap;

    #[test]
    fn only_a_none_is_none() {
        assert!(is_none(&None::<String>));
        assert!(is_none(&None::<Vec<u8>>));
        assert!(!is_none(&Some(String::new())));
        assert!(!is_none(&Some(None::<u8>)), "Some(None) is written `null` but is not absent");
        assert!(!is_none(&()));
        assert!(!is_none(&0u64));
        assert!(!is_none(&""));
        assert!(!is_none(&vec![None::<u8>]));
        assert!(!is_none(&BTreeMap::<String, u8>::new()));
        assert!(!is_none(&serde_json::Value::Null), "a JSON null value is unit, not none");
    }
}
