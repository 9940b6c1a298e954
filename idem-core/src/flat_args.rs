//! The arguments of a tool that takes one struct marked `#[idem(flatten)]` (rmcp's
//! `Parameters<T>` style): the struct's fields are the tool's top-level JSON arguments, its schema
//! the tool's input schema, and its canonical JSON the intent, the same text as the same fields
//! passed as separate parameters (so the same key, for the same tool name).

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::canonical::KeyError;
use crate::macro_support::Intent;

/// One arguments struct, as the tool's whole arguments: serialized, deserialized and described
/// exactly as the struct is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flat<T>(pub T);

impl<T> From<(T,)> for Flat<T> {
    fn from((value,): (T,)) -> Self {
        Flat(value)
    }
}

impl<T: Serialize> Serialize for Flat<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Flat<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Flat)
    }
}

impl<T: JsonSchema> JsonSchema for Flat<T> {
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

impl<T: Serialize> Intent for Flat<T> {
    fn write_intent(&self, out: &mut Vec<u8>) -> Result<(), KeyError> {
        crate::canonical::canonicalize(&self.0, out)
    }
}
