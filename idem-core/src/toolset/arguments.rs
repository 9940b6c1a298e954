//! The arguments a model sends, parsed into a tool's typed arguments with errors that name the
//! field and say that nothing was executed.

use std::fmt::{Display, Write as _};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

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
    let parsed;
    let value = match args {
        Arguments::Json(v) => v,
        Arguments::Absent => &empty,
        Arguments::Text(text) if text.trim().is_empty() => &empty,
        Arguments::Text(text) => {
            // Straight from the text into the typed arguments: a `Value` would keep only the last
            // of two duplicate keys, and turn integers beyond 64 bits into floats.
            let mut de = serde_json::Deserializer::from_str(text);
            let object = text.trim_start().starts_with('{');
            let typed =
                if object { serde_path_to_error::deserialize(&mut de).map(Some) } else { Ok(None) };
            let syntax = |e: &serde_json::Error| {
                let mut msg = format!(
                    "the arguments of `{tool}` are not valid JSON ({e}); nothing was executed. Send one JSON object"
                );
                if text.contains("NaN") || text.contains("Infinity") {
                    msg.push_str(" (JSON has no NaN or Infinity: pass a finite number)");
                }
                msg
            };
            match typed {
                // serde's derives also accept an array for a struct: only an object will do, and
                // anything else is parsed only to say what it is.
                Ok(None) => {
                    parsed = serde_json::from_str::<Value>(text).map_err(|e| syntax(&e))?;
                    &parsed
                }
                Ok(Some(args)) => return de.end().map(|()| args).map_err(|e| syntax(&e)),
                Err(e) if e.inner().is_syntax() || e.inner().is_eof() => {
                    return Err(syntax(e.inner()));
                }
                Err(e) => return Err(field_error(tool, &e)),
            }
        }
    };
    if !value.is_object() {
        return Err(format!(
            "the arguments of `{tool}` must be a JSON object, not {}; nothing was executed",
            json_type(value)
        ));
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

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
