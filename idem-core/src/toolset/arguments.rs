//! The arguments a model sends, parsed into a tool's typed arguments with errors that name the
//! field and say that nothing was executed.

use std::fmt::{Display, Write as _};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::json_text;

/// The arguments of one call as the model sent them.
#[derive(Clone, Copy, Debug)]
pub enum Arguments<'a> {
    /// Parsed JSON (Anthropic `input`, MCP `arguments`).
    Json(&'a Value),
    /// JSON text (OpenAI `function.arguments`). Empty or blank text means `{}`.
    Text(&'a str),
    /// None sent (MCP `arguments` is optional): `{}`.
    Absent,
}

/// Parses the model's arguments into the tool's type, or says what is wrong, naming the field.
pub(super) fn parse<A: DeserializeOwned>(tool: &str, args: Arguments<'_>) -> Result<A, String> {
    let empty = Value::Object(Map::new());
    let value = match args {
        Arguments::Json(v) => {
            // Deserializing recurses as deep as the value nests: measure it first, without
            // recursion (JSON text is bounded the same way by serde_json's parser).
            crate::limits::check_value_depth(v).map_err(|e| {
                format!("invalid arguments for `{tool}`: {e}; nothing was executed")
            })?;
            v
        }
        Arguments::Absent => &empty,
        Arguments::Text(text) if text.trim().is_empty() => &empty,
        Arguments::Text(text) => {
            // One rule for argument text on every front door (json_text::check_arguments): one
            // object, unique member names at any depth, every value representable. Then straight
            // from the text into the typed arguments: a `Value` would turn integers beyond 64
            // bits into floats.
            json_text::check_arguments(tool, text)?;
            let mut de = serde_json::Deserializer::from_str(text);
            return serde_path_to_error::deserialize(&mut de)
                .map_err(|e| field_error(tool, &e))
                .and_then(|args| {
                    de.end().map(|()| args).map_err(|e| json_text::not_json(tool, text, &e))
                });
        }
    };
    if !value.is_object() {
        return Err(json_text::not_an_object(tool, value));
    }
    serde_path_to_error::deserialize(value).map_err(|e| field_error(tool, &e))
}

/// "invalid arguments for `tool`: field `a.b`: <what serde said>; ...".
fn field_error<E: Display>(tool: &str, e: &serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    let mut msg = format!("invalid arguments for `{tool}`: ");
    if path != "." {
        let _ = write!(msg, "field `{path}`: ");
    }
    let _ = write!(msg, "{}; nothing was executed, fix the arguments and call again", e.inner());
    msg
}
