//! The arguments of a `#[tool]` function: one generic type ([`Args`]) over a tuple of its
//! parameters and the names `#[tool]` declares for them ([`Fields`]), with their JSON form,
//! intent (canonical bytes) and JSON Schema.

use std::borrow::Cow;
use std::fmt::{self, Debug};
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use super::none_probe::{is_none, is_some_null};
use super::{Intent, ToolArg};
use crate::canonical::KeyError;
use crate::tool::Tool;

/// Builds a tool's arguments from the typed call's parameters, in declaration order.
pub fn make_args<T: Tool, P>(_tool: &T, params: P) -> T::Args
where
    T::Args: From<P>,
{
    T::Args::from(params)
}

/// What `#[tool]` declares for one tool's arguments: the names of its parameters, in order. Its
/// implementor is a zero-sized type (the tool's unit struct for a free fn); the values live in
/// the one generic type [`Args`], so a crate of many tools type-checks no derived code per tool.
pub trait Fields: 'static {
    /// The arguments type's name, for JSON Schema titles and error messages: `ChargeCardArgs`.
    const NAME: &'static str;
    /// The parameters' names, in declaration order: the JSON object's keys. As many as the
    /// tuple's elements (`#[tool]` writes both from the same parameter list).
    const NAMES: &'static [&'static str];
    /// Bit `i` set: parameter `i` is marked `#[idem(skip)]` and left out of the intent.
    const SKIP: u16 = 0;
    /// Bit `i` set: parameter `i` is marked `#[idem(skip_if_none)]` and left out of the intent
    /// when it is `None`, so that an optional parameter added to a tool keeps the keys of the
    /// calls that do not use it.
    const SKIP_IF_NONE: u16 = 0;
    /// The parameters' doc comments, in declaration order, for their JSON Schema `description`;
    /// empty for none (and shorter than `NAMES` when the last have none).
    const DOCS: &'static [&'static str] = &[];
    /// Bit `i` set: parameter `i`'s type may hold a hash set, so each call checks its name
    /// ([`ArgTuple::unordered_param`]). `#[tool]` clears the bits of the standard types it
    /// recognises (`String`, the numbers, `Option` or `Vec` of these), so a tool of only those
    /// pays nothing per call.
    const MAY_HOLD_SET: u16 = u16::MAX;
    /// Every parameter is in the intent and reads back from it as the same value
    /// ([`crate::Tool::ARGS_FROM_INTENT`]); `#[tool]` sets it for the standard types it
    /// recognises.
    const FROM_INTENT: bool = false;
}

/// The arguments of a tool declared with `#[tool]`: the parameters' values as a tuple `T` (up to
/// 16), named by `F`. Serialized and deserialized as a JSON object with one field per parameter,
/// as `#[derive(Serialize, Deserialize)]` with `deny_unknown_fields` would: fields in any order,
/// a missing `Option` field is `None`, a missing, unknown or repeated field is an error naming
/// it. Its JSON Schema is an object with one property per parameter, `required` for all but
/// `Option`s (however written), and `additionalProperties: false`: a field the model invents would otherwise be
/// dropped silently while the model believes it was applied.
pub struct Args<T, F>(pub T, PhantomData<fn() -> F>);

/// The parameter at `index`; the tuples and the names come from the same parameter list, so the
/// fallback is never used.
fn field_name(names: &[&'static str], index: usize) -> &'static str {
    names.get(index).copied().unwrap_or("?")
}

/// A tuple of tool arguments, one element per parameter: implemented for arities 0 to 16 (the
/// most `#[tool]` accepts) so that [`Args`] is generic code compiled once, in idem-core.
pub trait ArgTuple: Sized + Clone + Send + Sync + 'static {
    /// The number of elements.
    const LEN: usize;
    /// One `Option` per element, filled while a JSON object is read.
    type Slots;
    /// All slots empty.
    fn empty() -> Self::Slots;
    /// Reads the value of the field at `index` into its slot; a second value for the same field
    /// is an error (`duplicate field`).
    fn fill<'de, M: MapAccess<'de>>(
        slots: &mut Self::Slots,
        index: usize,
        names: &'static [&'static str],
        map: &mut M,
    ) -> Result<(), M::Error>;
    /// The tuple, once the object is read: a missing `Option` field is `None`, any other missing
    /// field is an error (`missing field`).
    fn finish<E: de::Error>(slots: Self::Slots, names: &'static [&'static str]) -> Result<Self, E>;
    /// The tuple from a sequence, element by element (as derived `Deserialize` accepts).
    fn from_seq<'de, A: SeqAccess<'de>>(
        seq: &mut A,
        expected: &dyn de::Expected,
    ) -> Result<Self, A::Error>;
    /// Serializes the elements whose bit in `skip` is not set, named by `names`; an element
    /// whose bit in `if_none` is set is left out when it is `None`.
    fn serialize_fields<S: SerializeStruct>(
        &self,
        names: &'static [&'static str],
        skip: u16,
        if_none: u16,
        out: &mut S,
    ) -> Result<(), S::Error>;
    /// Adds one JSON Schema property per element to `schema`, named and described by `F`, and
    /// to `required` unless a missing value of it is read (an `Option`).
    fn schema_properties<F: Fields>(generator: &mut SchemaGenerator, schema: &mut Schema);
    /// The name of the first element whose bit in `skip` is not set and whose type holds a hash
    /// set, by its type's name (`HashSet<..>` alone, or in an `Option`, a `Vec`, a map).
    fn unordered_param(names: &'static [&'static str], skip: u16) -> Option<&'static str>;
    /// The name of the first element whose bit in `skip` is not set and whose value is `Some` of
    /// a value written as `null` (`Some(None)`): written as `None` is, so the two share a key.
    fn some_null_param(&self, names: &'static [&'static str], skip: u16) -> Option<&'static str>;
}

/// Whether a type, by its name, holds a hash set (`HashSet<..>`, alone or in an `Option`, a
/// `Vec`, a map): a set that lists its members in another order in every copy, so its canonical
/// JSON (an array, in that order) and the key would differ between two copies of one set. A type
/// of the application's own that holds one is not seen here (`docs/key-spec.md`).
fn unordered(type_name: &str) -> bool {
    type_name.contains("HashSet<") || type_name.contains("DashSet<")
}

/// A deserializer for a field that is absent: an `Option` becomes `None`, anything else is a
/// `missing field` error (what serde's derive does).
struct MissingField<E>(&'static str, PhantomData<E>);

impl<'de, E: de::Error> Deserializer<'de> for MissingField<E> {
    type Error = E;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, E> {
        Err(E::missing_field(self.0))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, E> {
        visitor.visit_none()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

fn missing<T: DeserializeOwned, E: de::Error>(name: &'static str) -> Result<T, E> {
    T::deserialize(MissingField(name, PhantomData))
}

/// Whether a missing field of type `T` is read (as `None`): an `Option` however it is written
/// (`Option<String>`, a path to it, an alias such as `type Memo = Option<String>`), or a type
/// whose `Deserialize` reads an absent value as one does. Such a field is not `required` in the
/// schema, so that the schema says what the arguments' `Deserialize` accepts (schemars' derive
/// also asks the type, not how it is written).
fn absence_reads<T: DeserializeOwned>() -> bool {
    missing::<T, de::value::Error>("").is_ok()
}

fn add_property<T: JsonSchema + DeserializeOwned, F: Fields>(
    index: usize,
    generator: &mut SchemaGenerator,
    schema: &mut Schema,
) {
    let name = field_name(F::NAMES, index);
    let optional = generator.contract().is_deserialize() && absence_reads::<T>();
    let mut property = generator.subschema_for::<T>();
    if let Some(doc) = F::DOCS.get(index).filter(|d| !d.is_empty()) {
        property.insert("description".into(), (*doc).into());
    }
    let object = schema.ensure_object();
    if let Some(properties) = object
        .entry("properties")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()))
        .as_object_mut()
    {
        properties.insert(name.to_owned(), property.into());
    }
    if !optional
        && let Some(required) = object
            .entry("required")
            .or_insert_with(|| serde_json::Value::Array(Vec::new()))
            .as_array_mut()
    {
        required.push(name.into());
    }
}

macro_rules! arg_tuples {
    ($( ($len:literal; $($idx:tt $T:ident $v:ident),*) )*) => {$(
        impl<$($T: ToolArg),*> ArgTuple for ($($T,)*) {
            const LEN: usize = $len;
            type Slots = ($(Option<$T>,)*);

            #[allow(clippy::unused_unit)]
            fn empty() -> Self::Slots {
                ($(None::<$T>,)*)
            }

            #[allow(unused_variables)]
            fn fill<'de, M: MapAccess<'de>>(
                slots: &mut Self::Slots,
                index: usize,
                names: &'static [&'static str],
                map: &mut M,
            ) -> Result<(), M::Error> {
                match index {
                    $($idx => {
                        if slots.$idx.is_some() {
                            return Err(de::Error::duplicate_field(field_name(names, $idx)));
                        }
                        slots.$idx = Some(map.next_value()?);
                    })*
                    _ => {}
                }
                Ok(())
            }

            #[allow(unused_variables)]
            fn finish<E: de::Error>(
                slots: Self::Slots,
                names: &'static [&'static str],
            ) -> Result<Self, E> {
                Ok(($(
                    match slots.$idx {
                        Some($v) => $v,
                        None => missing::<$T, E>(field_name(names, $idx))?,
                    },
                )*))
            }

            #[allow(unused_variables)]
            fn from_seq<'de, A: SeqAccess<'de>>(
                seq: &mut A,
                expected: &dyn de::Expected,
            ) -> Result<Self, A::Error> {
                Ok(($(
                    match seq.next_element::<$T>()? {
                        Some($v) => $v,
                        None => return Err(de::Error::invalid_length($idx, expected)),
                    },
                )*))
            }

            #[allow(unused_variables)]
            fn serialize_fields<S: SerializeStruct>(
                &self,
                names: &'static [&'static str],
                skip: u16,
                if_none: u16,
                out: &mut S,
            ) -> Result<(), S::Error> {
                $(
                    let name = field_name(names, $idx);
                    if skip & (1 << $idx) != 0 {
                        // Left out of the intent.
                    } else if if_none & (1 << $idx) != 0 && is_none(&self.$idx) {
                        out.skip_field(name)?;
                    } else {
                        out.serialize_field(name, &self.$idx)?;
                    }
                )*
                Ok(())
            }

            #[allow(unused_variables)]
            fn schema_properties<F: Fields>(generator: &mut SchemaGenerator, schema: &mut Schema) {
                $( add_property::<$T, F>($idx, generator, schema); )*
            }

            #[allow(unused_variables)]
            fn unordered_param(
                names: &'static [&'static str],
                skip: u16,
            ) -> Option<&'static str> {
                $(
                    if skip & (1 << $idx) == 0 && unordered(std::any::type_name::<$T>()) {
                        return Some(field_name(names, $idx));
                    }
                )*
                None
            }

            #[allow(unused_variables)]
            fn some_null_param(
                &self,
                names: &'static [&'static str],
                skip: u16,
            ) -> Option<&'static str> {
                $(
                    if skip & (1 << $idx) == 0 && is_some_null(&self.$idx) {
                        return Some(field_name(names, $idx));
                    }
                )*
                None
            }
        }

        impl<$($T: Debug,)* F: Fields> Debug for Args<($($T,)*), F> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut out = f.debug_struct(F::NAME);
                $( out.field(field_name(F::NAMES, $idx), &(self.0).$idx); )*
                out.finish()
            }
        }

        impl<$($T,)* F> Args<($($T,)*), F> {
            /// The arguments, one value per parameter in declaration order.
            #[allow(clippy::too_many_arguments, clippy::new_without_default)]
            pub fn new($($v: $T),*) -> Self {
                Args(($($v,)*), PhantomData)
            }
        }
    )*};
}

arg_tuples! {
    (0;)
    (1; 0 T0 v0)
    (2; 0 T0 v0, 1 T1 v1)
    (3; 0 T0 v0, 1 T1 v1, 2 T2 v2)
    (4; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3)
    (5; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4)
    (6; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5)
    (7; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6)
    (8; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7)
    (9; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8)
    (10; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9)
    (11; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9, 10 T10 v10)
    (12; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9, 10 T10 v10, 11 T11 v11)
    (13; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9, 10 T10 v10, 11 T11 v11, 12 T12 v12)
    (14; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9, 10 T10 v10, 11 T11 v11, 12 T12 v12, 13 T13 v13)
    (15; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9, 10 T10 v10, 11 T11 v11, 12 T12 v12, 13 T13 v13, 14 T14 v14)
    (16; 0 T0 v0, 1 T1 v1, 2 T2 v2, 3 T3 v3, 4 T4 v4, 5 T5 v5, 6 T6 v6, 7 T7 v7, 8 T8 v8,
        9 T9 v9, 10 T10 v10, 11 T11 v11, 12 T12 v12, 13 T13 v13, 14 T14 v14, 15 T15 v15)
}

/// The most parameters a `#[tool]` may have (the arities [`ArgTuple`] is implemented for).
pub const MAX_PARAMS: usize = 16;

impl<T, F> From<T> for Args<T, F> {
    fn from(values: T) -> Self {
        Args(values, PhantomData)
    }
}

impl<T: Clone, F> Clone for Args<T, F> {
    fn clone(&self) -> Self {
        Args(self.0.clone(), PhantomData)
    }
}

impl<T: ArgTuple, F: Fields> Serialize for Args<T, F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct(F::NAME, T::LEN)?;
        self.0.serialize_fields(F::NAMES, 0, 0, &mut out)?;
        out.end()
    }
}

/// The arguments that make up the intent: all but the skipped ones, and those skipped when
/// `None` that are.
struct IntentFields<'a, T, F>(&'a Args<T, F>);

impl<T: ArgTuple, F: Fields> Serialize for IntentFields<'_, T, F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let kept = T::LEN - (F::SKIP.count_ones() as usize).min(T::LEN);
        let mut out = serializer.serialize_struct(F::NAME, kept)?;
        self.0.0.serialize_fields(F::NAMES, F::SKIP, F::SKIP_IF_NONE, &mut out)?;
        out.end()
    }
}

impl<T: ArgTuple, F: Fields> Intent for Args<T, F> {
    const FROM_INTENT: bool = F::FROM_INTENT;

    fn write_intent(&self, out: &mut Vec<u8>) -> Result<(), KeyError> {
        // Constant per tool: the test is compiled out when no parameter may hold a set.
        let unchecked = F::SKIP | !F::MAY_HOLD_SET;
        if unchecked != u16::MAX
            && let Some(name) = T::unordered_param(F::NAMES, unchecked)
        {
            return Err(KeyError::UnorderedSet { path: name.to_owned() });
        }
        // `Some(None)` is written `null`, as `None` is: the two calls would share a key (a
        // parameter marked `skip_if_none` leaves `None` out, so it tells them apart).
        if let Some(name) = self.0.some_null_param(F::NAMES, F::SKIP | F::SKIP_IF_NONE) {
            return Err(KeyError::AmbiguousNull { path: name.to_owned() });
        }
        if F::SKIP == 0 && F::SKIP_IF_NONE == 0 {
            return crate::canonical::canonicalize(self, out);
        }
        crate::canonical::canonicalize(&IntentFields(self), out)?;
        if F::SKIP == 0 {
            return Ok(());
        }
        // The skipped parameters are not part of the key, but the tool still receives (and a
        // retry clones) them: they are held to the same depth limit. Only depth is checked;
        // anything else about them is the tool's business.
        crate::limits::check_depth(self)
    }
}

/// The index of a field, from its name in a JSON object's key.
struct FieldIndex<F>(PhantomData<fn() -> F>);

impl<'de, F: Fields> de::DeserializeSeed<'de> for FieldIndex<F> {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl<'de, F: Fields> Visitor<'de> for FieldIndex<F> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field identifier")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<usize, E> {
        match usize::try_from(value) {
            Ok(index) if index < F::NAMES.len() => Ok(index),
            _ => Err(E::invalid_value(
                de::Unexpected::Unsigned(value),
                &format!("field index 0 <= i < {}", F::NAMES.len()).as_str(),
            )),
        }
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<usize, E> {
        F::NAMES
            .iter()
            .position(|name| *name == value)
            .ok_or_else(|| E::unknown_field(value, F::NAMES))
    }

    fn visit_bytes<E: de::Error>(self, value: &[u8]) -> Result<usize, E> {
        match std::str::from_utf8(value) {
            Ok(s) => self.visit_str(s),
            Err(_) => Err(E::unknown_field(&String::from_utf8_lossy(value), F::NAMES)),
        }
    }
}

struct ArgsVisitor<T, F>(PhantomData<fn() -> (T, F)>);

impl<'de, T: ArgTuple, F: Fields> Visitor<'de> for ArgsVisitor<T, F> {
    type Value = Args<T, F>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "struct {}", F::NAME)
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut slots = T::empty();
        while let Some(index) = map.next_key_seed(FieldIndex::<F>(PhantomData))? {
            T::fill(&mut slots, index, F::NAMES, &mut map)?;
        }
        Ok(Args(T::finish(slots, F::NAMES)?, PhantomData))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let expected = SeqLen::<F>(T::LEN, PhantomData);
        Ok(Args(T::from_seq(&mut seq, &expected)?, PhantomData))
    }
}

/// "struct ChargeCardArgs with 2 elements", as serde's derive says for a short sequence.
struct SeqLen<F>(usize, PhantomData<fn() -> F>);

impl<F: Fields> de::Expected for SeqLen<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "struct {} with {} elements", F::NAME, self.0)
    }
}

impl<'de, T: ArgTuple, F: Fields> Deserialize<'de> for Args<T, F> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct(F::NAME, F::NAMES, ArgsVisitor(PhantomData))
    }
}

impl<T: ArgTuple, F: Fields> JsonSchema for Args<T, F> {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed(F::NAME)
    }

    fn schema_id() -> Cow<'static, str> {
        Cow::Borrowed(std::any::type_name::<Self>())
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut schema = schemars::json_schema!({
            "type": "object",
            "additionalProperties": false,
        });
        T::schema_properties::<F>(generator, &mut schema);
        schema
    }
}
