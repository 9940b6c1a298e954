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

macro_rules! not_none {
    ($($method:ident($($ty:ty),*);)*) => {$(
        fn $method(self, $(_: $ty),*) -> Result<bool, NotNone> {
            Ok(false)
        }
    )*};
}

/// What both probes share: their types (answers are `bool`s, and a compound is never looked
/// into), `false` for every scalar and enum variant, and `$extra` methods of the same shape.
macro_rules! scalars_not_none {
    ($($extra:tt)*) => {
        type Ok = bool;
        type Error = NotNone;
        type SerializeSeq = Impossible<bool, NotNone>;
        type SerializeTuple = Impossible<bool, NotNone>;
        type SerializeTupleStruct = Impossible<bool, NotNone>;
        type SerializeTupleVariant = Impossible<bool, NotNone>;
        type SerializeMap = Impossible<bool, NotNone>;
        type SerializeStruct = Impossible<bool, NotNone>;
        type SerializeStructVariant = Impossible<bool, NotNone>;

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
            serialize_unit_variant(&'static str, u32, &'static str);
            $($extra)*
        }
    };
}

/// True when `value` is `Some` of a value written as `null` (`Some(None)`, `Some(Value::Null)`,
/// `Some(())`), through newtypes: JSON writes it as it writes `None`, so the two would share a
/// key. False for anything else, without serializing the rest of the value.
pub(crate) fn is_some_null<T: Serialize + ?Sized>(value: &T) -> bool {
    matches!(value.serialize(SomeProbe { inside: false, wrappers: 0 }), Ok(true))
}

/// Answers whether the value is `Some` (`inside: false`) of a value written as `null`
/// (`inside: true`, the value under the `Some`). `wrappers` counts the `Some`s and newtypes
/// passed: a recursive type built in code may chain them without end, and the probe stops at
/// the limit the canonical form refuses ([`crate::limits::MAX_WRAPPERS`]).
struct SomeProbe {
    inside: bool,
    wrappers: usize,
}

impl SomeProbe {
    fn under<T: Serialize + ?Sized>(self, inside: bool, value: &T) -> Result<bool, NotNone> {
        if self.wrappers >= crate::limits::MAX_WRAPPERS {
            return Ok(false);
        }
        value.serialize(SomeProbe { inside, wrappers: self.wrappers + 1 })
    }
}

impl Serializer for SomeProbe {
    fn serialize_none(self) -> Result<bool, NotNone> {
        Ok(self.inside)
    }

    fn serialize_unit(self) -> Result<bool, NotNone> {
        Ok(self.inside)
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<bool, NotNone> {
        Ok(self.inside)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<bool, NotNone> {
        self.under(true, value)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<bool, NotNone> {
        let inside = self.inside;
        self.under(inside, value)
    }

    scalars_not_none! {}

    crate::canonical::refuse::refuse_compounds!(NotNone, Err(NotNone));
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

impl Serializer for NoneProbe {
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

    scalars_not_none! {
        serialize_unit();
        serialize_unit_struct(&'static str);
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

    #[test]
    fn only_a_some_of_null_is_a_some_of_null() {
        use super::is_some_null;
        assert!(is_some_null(&Some(None::<String>)));
        assert!(is_some_null(&Some(serde_json::Value::Null)));
        assert!(is_some_null(&Some(())));
        assert!(is_some_null(&Some(Some(None::<u8>))));
        assert!(!is_some_null(&None::<Option<String>>));
        assert!(!is_some_null(&Some(Some(String::new()))));
        assert!(!is_some_null(&Some(0u8)));
        assert!(!is_some_null(&serde_json::Value::Null), "a null that is not under a Some");
        assert!(!is_some_null(&()));
        assert!(!is_some_null(&Some(vec![None::<u8>])));
        assert!(!is_some_null(&Some(BTreeMap::<String, u8>::new())));
        // A chain longer than the canonical form takes ends the probe, not the stack.
        #[derive(serde::Serialize)]
        struct Link(Option<Box<Link>>);
        let mut chain = Link(None);
        for _ in 0..2 * crate::limits::MAX_WRAPPERS {
            chain = Link(Some(Box::new(chain)));
        }
        assert!(!is_some_null(&chain));
    }
}
