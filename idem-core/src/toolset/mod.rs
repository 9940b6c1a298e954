//! Agent-facing tool sets (`docs/design.md` §7): list tool definitions for a model and dispatch the calls
//! a model makes, by name with JSON arguments, always through the idem protocol.
//!
//! A [`ToolSet`] holds heterogeneous tools behind the object-safe [`DynTool`] adapter. It speaks
//! the shapes agents produce:
//!
//! | format | definitions | call in | result out |
//! |---|---|---|---|
//! | OpenAI chat | [`ToolSet::openai_tools`] | `tool_calls[i]`: `{"id","type":"function","function":{"name","arguments":"<JSON text>"}}` | `{"role":"tool","tool_call_id","content"}` |
//! | OpenAI Responses | [`ToolSet::openai_responses_tools`] | `function_call` item: `{"type":"function_call","call_id","name","arguments":"<JSON text>"}` | `{"type":"function_call_output","call_id","output"}` |
//! | Anthropic messages | [`ToolSet::anthropic_tools`] | `tool_use` block: `{"type":"tool_use","id","name","input":{..}}` | `{"type":"tool_result","tool_use_id","content","is_error"}` |
//! | Gemini `generateContent` | [`ToolSet::gemini_tools`] | `functionCall` part: `{"functionCall":{"id"?,"name","args":{..}}}` | `{"functionResponse":{"id"?,"name","response":{"output"} or {"error"}}}` |
//! | MCP `tools/call` | [`ToolSet::mcp_tools`] | params: `{"name","arguments","_meta"}` | `CallToolResult`: `{"content":[{"type":"text","text"}],"isError"}` |
//!
//! Everything a model can cause comes back as a [`ToolResult`] it can read, never a panic:
//! unknown tool, malformed or ill-typed arguments (naming the field), NaN, a caller key reused
//! with other arguments, store unavailable, budget exhausted, and outcome unknown, whose text says
//! that the action may have happened, must not be repeated, and what to check.
//!
//! The key scope is the [`Run`] given to each call. The tool-call id a model invents (OpenAI
//! chat `id`, Responses `call_id`, Anthropic `id`, Gemini `id`) is recorded for tracing only
//! ([`Run::with_call_id`]) and is not part of the key: a model that repeats a call sends a new id
//! for the same intent.
//!
//! Modules by job: the registry and dispatch (this module), [`Arguments`] parsing, the
//! [`ToolResult`] a model reads, and one module per wire format (OpenAI chat completions, OpenAI
//! Responses, Anthropic, Gemini, MCP).

mod anthropic;
pub(crate) mod arguments;
mod gemini;
mod mcp;
mod openai;
mod openai_responses;
mod result;
pub(crate) mod same_key;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::{Map, Value};

pub use self::arguments::Arguments;
pub use self::mcp::{
    Annotations, MAX_META_ID_BYTES, MCP_META_IDEMPOTENCY_KEY, MCP_META_KEY, MCP_META_OUTCOME,
    MCP_META_RUN, McpCall, McpProtocolError, MissingRun, mcp_run,
};
pub use self::result::ToolResult;
pub use crate::error::ErrorKind;

use crate::class::RetryClass;
use crate::executor::Run;
use crate::tool::{Tool, ToolDef};

/// What a model is told about one tool.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    /// The stable name (part of every key).
    pub name: &'static str,
    /// The description (the tool fn's doc comment).
    pub description: &'static str,
    /// The retry class.
    pub class: RetryClass,
    /// JSON Schema (2020-12, from schemars) of the arguments; always `"type": "object"`, with
    /// `properties` (`{}` for a tool without arguments).
    pub input_schema: Map<String, Value>,
    /// The MCP annotations derived from the class.
    pub annotations: Annotations,
}

/// What a dispatch knows about the set it belongs to (to tell the model what to check after an
/// unknown outcome). Built by [`ToolSet`].
#[derive(Clone, Debug, Default)]
pub struct DispatchContext {
    read_only: Vec<&'static str>,
    /// Tools whose arguments read every number one way (sorted): no union in their schema
    /// offers an integer and a number, so `5.0` and `5` cannot be two values to them and the
    /// check of `same_key.rs` is skipped. Derived from the schema once, when a tool joins the
    /// set; a context built otherwise holds none, and every call is checked.
    one_number_reading: Vec<&'static str>,
}

/// An object-safe view of a [`Tool`], implemented for every `T: Tool`, so that one [`ToolSet`]
/// holds tools of different argument, output and error types.
pub trait DynTool: Send + Sync + 'static {
    /// The tool's definition.
    fn tool_def(&self) -> &'static ToolDef;
    /// The JSON Schema of the arguments (schemars, JSON Schema 2020-12).
    fn input_schema(&self) -> Value;
    /// The JSON Schema of the arguments as they are written into the key (schemars' serialize
    /// contract): a member the arguments read but never write (`#[serde(skip_serializing)]`) is
    /// missing here. `Value::Null` (the default) when unknown: nothing is compared then.
    fn written_schema(&self) -> Value {
        Value::Null
    }
    /// Parses `args`, calls the tool through `run` (the idem protocol) and renders the outcome.
    /// Never panics on input: every failure is a [`ToolResult`] with `is_error`.
    fn dispatch<'a>(
        &'a self,
        run: &'a Run,
        args: Arguments<'a>,
        cx: &'a DispatchContext,
    ) -> BoxFuture<'a, ToolResult>;
}

/// The schema of a tool's arguments, in the form every host and model API reads: JSON Schema
/// 2020-12 (MCP's default dialect, spec 2025-11-25 "JSON Schema Usage") without a `$schema`
/// member, and with each type written where it is used instead of in `$defs` behind a `$ref`
/// (a recursive type still needs one). Gemini CLI's validator fails a call whose schema names
/// the 2020-12 meta-schema, and Gemini's API and CLI refuse `$ref`s to `$defs`; every JSON
/// Schema reader accepts the inline form.
pub(crate) fn input_schema_for<T: schemars::JsonSchema>() -> Value {
    schema_for::<T>(schemars::generate::SchemaSettings::draft2020_12())
}

/// [`input_schema_for`] under schemars' serialize contract: the members the arguments write.
fn written_schema_for<T: schemars::JsonSchema>() -> Value {
    schema_for::<T>(schemars::generate::SchemaSettings::draft2020_12().for_serialize())
}

fn schema_for<T: schemars::JsonSchema>(settings: schemars::generate::SchemaSettings) -> Value {
    let settings = settings.with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    });
    let mut schema = settings.into_generator().into_root_schema_for::<T>().to_value();
    if let Value::Object(root) = &mut schema {
        // The Rust type's name ("ChargeCardArgs"): noise to a model, and no host shows it.
        root.remove("title");
    }
    schema
}

/// Rewrites a tool's argument schema into the forms every host reads, with the same meaning:
///
/// - Every subschema is an object: schemars writes `true` for a value of any JSON
///   (`serde_json::Value`) and `false` for one nothing satisfies, which JSON Schema allows, but
///   MCP's schema types each member of `inputSchema.properties` as an object (the TypeScript SDK
///   refuses a whole `tools/list` with one boolean there), and Gemini's function declarations
///   have no boolean schemas at any depth. `{}` and `{"not": {}}` mean the same.
///   (`additionalProperties: false` is a keyword's value, read by every host, and stays;
///   `additionalProperties: true`, a map of any JSON, is `{}`.)
/// - Every subschema has at most one `type`: Gemini's function declarations (OpenAPI 3.0's
///   subset) take one, and a `"type": ["array", "null"]` anywhere, which schemars writes for
///   `Option`s, fails every request that declares the tool with HTTP 400; hosts that convert it
///   for Gemini split it into an `anyOf` whose array branch has lost its `items`. A type list is
///   written as the `anyOf` of one type each, which Gemini, OpenAI's strict mode and every JSON
///   Schema reader take: `null` stays allowed, so a host that makes every property required
///   (strict mode) still lets the model send `null` for `None`.
/// - A number has no `format`: schemars writes the Rust width (`uint64`, `uint`, `int32`,
///   `double`, ...), which JSON Schema does not define; hosts that compile schemas with Ajv warn
///   about every such field on every connection, or refuse the tool. `minimum` and `maximum`
///   keep the constraint.
fn host_readable(schema: &mut serde_json::Map<String, Value>) {
    one_type_each(schema);
    if matches!(schema.get("type").and_then(Value::as_str), Some("integer" | "number")) {
        schema.remove("format");
    }
    for keyword in ["properties", "$defs", "definitions", "patternProperties", "dependentSchemas"] {
        if let Some(Value::Object(members)) = schema.get_mut(keyword) {
            members.values_mut().for_each(host_readable_value);
        }
    }
    for keyword in ["anyOf", "oneOf", "allOf", "prefixItems", "items"] {
        if let Some(Value::Array(items)) = schema.get_mut(keyword) {
            items.iter_mut().for_each(host_readable_value);
        }
    }
    for keyword in ["items", "contains", "not", "if", "then", "else", "propertyNames"] {
        if let Some(sub) = schema.get_mut(keyword).filter(|s| !s.is_array()) {
            host_readable_value(sub);
        }
    }
    // `false` forbids members and stays (every host reads it, and strict modes require it);
    // `true` (schemars' for a map of any JSON) is a boolean schema like any other, written `{}`.
    for keyword in ["additionalProperties", "unevaluatedProperties"] {
        if let Some(sub @ (Value::Object(_) | Value::Bool(true))) = schema.get_mut(keyword) {
            host_readable_value(sub);
        }
    }
}

/// [`host_readable`] of one subschema, which may be a boolean.
fn host_readable_value(schema: &mut Value) {
    match schema {
        Value::Bool(true) => *schema = Value::Object(serde_json::Map::new()),
        Value::Bool(false) => *schema = serde_json::json!({ "not": {} }),
        Value::Object(object) => host_readable(object),
        _ => {}
    }
}

/// A type list (`"type": ["string", "null"]`) as an `anyOf` with one type per branch, each with
/// the schema's other assertions (JSON Schema applies a type's keywords to that type's values
/// only, so the meaning is the same); annotations stay outside. A one-element list is its type.
fn one_type_each(schema: &mut serde_json::Map<String, Value>) {
    let Some(Value::Array(types)) = schema.get("type") else { return };
    if types.len() == 1 {
        let only = types[0].clone();
        schema.insert("type".into(), only);
        return;
    }
    if ["anyOf", "oneOf"].iter().any(|k| schema.contains_key(*k)) {
        // Another combination at the same level: left as written rather than nested.
        return;
    }
    let types = types.clone();
    const ANNOTATIONS: [&str; 8] = [
        "description",
        "title",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
    ];
    let mut assertions = std::mem::take(schema);
    assertions.remove("type");
    for annotation in ANNOTATIONS {
        if let Some(value) = assertions.remove(annotation) {
            schema.insert(annotation.into(), value);
        }
    }
    let branches = types
        .into_iter()
        .map(|t| {
            if t == "null" {
                return serde_json::json!({ "type": "null" });
            }
            let mut branch = assertions.clone();
            if let Some(Value::Array(values)) = branch.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            branch.insert("type".into(), t);
            Value::Object(branch)
        })
        .collect();
    schema.insert("anyOf".into(), Value::Array(branches));
}

impl<T: Tool> DynTool for T {
    fn tool_def(&self) -> &'static ToolDef {
        self.def()
    }

    fn input_schema(&self) -> Value {
        input_schema_for::<T::Args>()
    }

    fn written_schema(&self) -> Value {
        written_schema_for::<T::Args>()
    }

    fn dispatch<'a>(
        &'a self,
        run: &'a Run,
        args: Arguments<'a>,
        cx: &'a DispatchContext,
    ) -> BoxFuture<'a, ToolResult> {
        let def = self.def();
        // The tool's own code outside its body runs here too: its arguments' `Deserialize` and
        // `Serialize` (read from the call, written into the key), its output's and error's
        // `Serialize` and `Display` (the result). A panic there is this call's error result, not
        // an unwind through the host's server; the executor has already settled the key (a
        // panic after the effect is recorded there, `executor/caught.rs`).
        let call = FutureExt::catch_unwind(AssertUnwindSafe(dispatch_typed(self, run, args, cx)));
        Box::pin(call.map(move |done| {
            done.unwrap_or_else(|payload| {
                let message = crate::executor::panic_message(payload.as_ref());
                ToolResult::error(
                    ErrorKind::Panicked,
                    format!(
                        "`{}` panicked in its own code around the call (its types' `Deserialize`, `Serialize` or `Display`): {message}; a repeat with the same arguments is answered from the call's record if it ran",
                        def.name
                    ),
                    None,
                )
            })
        }))
    }
}

/// The call of [`DynTool::dispatch`], whose panics it catches.
async fn dispatch_typed<T: Tool>(
    tool: &T,
    run: &Run,
    args: Arguments<'_>,
    cx: &DispatchContext,
) -> ToolResult {
    let def = tool.def();
    let parsed: T::Args = match arguments::parse(def.name, args) {
        Ok(args) => args,
        Err(message) => {
            return ToolResult::error(ErrorKind::InvalidArguments, message, None);
        }
    };
    let ambiguous = same_key::null_read_as_some::<T>(def.name, args, &parsed)
        .map(|path| crate::KeyError::AmbiguousNull { path })
        .or_else(|| {
            if cx.one_number_reading.binary_search(&def.name).is_ok() {
                return None;
            }
            same_key::float_keyed_as_integer::<T>(args, &parsed)
                .map(|(path, number)| crate::KeyError::AmbiguousNumber { path, number })
        });
    if let Some(source) = ambiguous {
        let e = crate::Error::<T::Error>::InvalidArguments { tool: def.name, source };
        return result::error_result(def, &e, cx);
    }
    let (result, report) = run.call_reported_checked(tool, parsed, true).await;
    // The executor checked an output it stored: checking again would walk it 3 times more.
    let checked = report.as_ref().is_some_and(|r| r.output_checked);
    let out = match result {
        Ok(output) => {
            match (if checked { Ok(()) } else { crate::executor::storable(&output).map(drop) })
                .and_then(|()| match serde_json::to_value(&output) {
                    Ok(v) => Ok(ToolResult::success(v)),
                    // A `Value` holds no integer beyond 64 bits, which JSON text (and the
                    // record) holds exactly: the result is read from the text instead.
                    Err(e) => serde_json::to_string(&output)
                        .and_then(|json| ToolResult::success_from_text(&json))
                        .map_err(|_| e.to_string()),
                }) {
                Ok(result) => result,
                // JSON would carry another value (a NaN as `null`): say so rather than mislead.
                Err(why) => ToolResult::error(
                    ErrorKind::OutputNotJson,
                    format!(
                        "`{}` ran, but its output cannot be turned into JSON faithfully ({why}); the effect happened: do not call it again for this intent",
                        def.name
                    ),
                    None,
                ),
            }
        }
        Err(e) => result::error_result(def, &e, cx),
    };
    out.with_report(report)
}

/// Why a tool cannot join a set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSetError {
    /// Two tools share a name; names select the tool and are part of every key.
    #[error("a tool named `{0}` is already in the set; tool names must be unique")]
    DuplicateName(&'static str),
    /// The name is not 1 to 64 characters from `A-Z a-z 0-9 _ -` (`^[a-zA-Z0-9_-]{1,64}$`, the
    /// rule `#[tool]` checks at compile time). MCP (spec 2025-11-25, "Tool names") allows more
    /// (`.`, up to 128), but OpenAI's and Anthropic's APIs refuse the whole request, and Claude
    /// Desktop withholds every tool of a server, when one name breaks this rule.
    #[error(
        "tool name `{0}` is not usable by agents: use 1 to 64 ASCII letters, digits, `_` or `-` (OpenAI and Anthropic function names; Claude Desktop refuses a server's whole tool list over one other name, though MCP allows `.` and up to 128)"
    )]
    InvalidName(&'static str),
    /// The arguments' schema is not an object schema: MCP requires `inputSchema` of
    /// `"type": "object"`, and models send arguments as an object.
    #[error(
        "the arguments of tool `{0}` do not have an object schema; make the arguments a struct with named fields"
    )]
    NotAnObject(&'static str),
    /// The arguments' schema combines schemas at its root (`oneOf`, `anyOf`, `allOf`), which
    /// `#[serde(flatten)]` of an enum or an `Option` writes. Anthropic's Messages API refuses a
    /// whole request naming such a tool (`input_schema does not support oneOf, allOf, or anyOf
    /// at the top level`), as OpenAI's strict function calling does: refused here, when the set
    /// is built, rather than on the first call to the model.
    #[error(
        "the arguments of tool `{tool}` have `{keyword}` at the root of their schema, which Anthropic's API (and OpenAI's strict mode) refuse for the whole request; `#[serde(flatten)]` of an enum or an `Option` writes it: make that enum or option a named field of the arguments instead"
    )]
    CombinedAtRoot {
        /// The tool's name.
        tool: &'static str,
        /// The first of `oneOf`, `anyOf`, `allOf` found at the root.
        keyword: &'static str,
    },
    /// A top-level argument's name is not 1 to 64 characters from `A-Z a-z 0-9 _ . -`
    /// (`^[a-zA-Z0-9_.-]{1,64}$`): Anthropic's API (and Bedrock's) refuse a whole request whose
    /// tool has such a property ("Property keys should match pattern"). A parameter named with
    /// letters beyond ASCII (`prénom`), or a field renamed to `filter[id]` or `Account Number`,
    /// breaks it.
    #[error(
        "the argument `{property}` of tool `{tool}` has a name Anthropic's API refuses for the whole request: use 1 to 64 ASCII letters, digits, `_`, `.` or `-` (rename the parameter, or the field with `#[serde(rename = \"..\")]`)"
    )]
    InvalidArgumentName {
        /// The tool's name.
        tool: &'static str,
        /// The argument's name as published (printable: control characters escaped).
        property: String,
    },
    /// The arguments read a member they never write (`#[serde(skip_serializing)]` on a field):
    /// the key is derived from what the arguments write, so two calls that differ only in that
    /// member would share one key, and the second would be answered with the first's outcome.
    #[error(
        "the arguments of tool `{tool}` read `{property}` but never write it (`#[serde(skip_serializing)]`), so it is not part of the idempotency key and two calls that differ only in it would share one; let it be written, or mark it `#[serde(skip)]` if the tool does not read it either"
    )]
    ReadButNotKeyed {
        /// The tool's name.
        tool: &'static str,
        /// Where the member is, as property names joined by `.` (printable).
        property: String,
    },
}

/// The first member `read` (a schema under the deserialize contract) has and `written` (the
/// same type's under the serialize contract) lacks, as property names joined by `.`. Both are
/// walked in step: `properties` by name, the subschemas of `anyOf`, `oneOf`, `allOf` and
/// `prefixItems` by index when both list as many, and `items` and `additionalProperties`.
/// `$ref`s are not followed (a recursive type's schema is walked once).
fn read_not_written(read: &Value, written: &Value) -> Option<String> {
    let (Value::Object(read), Value::Object(written)) = (read, written) else { return None };
    if let (Some(Value::Object(r)), Some(Value::Object(w))) =
        (read.get("properties"), written.get("properties"))
    {
        // A member read and not written is skipped, unless a member written and not read has
        // the same schema: one field read under one name and written under another
        // (`rename(deserialize = ..)`). Paired one for one, so that a member only written
        // (`skip_deserializing`) does not hide one only read.
        let mut only_written: Vec<&Value> =
            w.iter().filter(|(name, _)| !r.contains_key(*name)).map(|(_, sub)| sub).collect();
        for (name, sub) in r {
            let Some(w) = w.get(name) else {
                match only_written.iter().position(|written| *written == sub) {
                    Some(renamed) => {
                        only_written.swap_remove(renamed);
                    }
                    None => return Some(name.clone()),
                }
                continue;
            };
            if let Some(inner) = read_not_written(sub, w) {
                return Some(format!("{name}.{inner}"));
            }
        }
    }
    // Maps with integer keys (schemars: `patternProperties`, one pattern per key type).
    if let (Some(Value::Object(r)), Some(Value::Object(w))) =
        (read.get("patternProperties"), written.get("patternProperties"))
        && let Some(found) =
            r.iter().find_map(|(pattern, r)| w.get(pattern).and_then(|w| read_not_written(r, w)))
    {
        return Some(found);
    }
    for keyword in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let (Some(Value::Array(r)), Some(Value::Array(w))) =
            (read.get(keyword), written.get(keyword))
            && r.len() == w.len()
            && let Some(found) = r.iter().zip(w).find_map(|(r, w)| read_not_written(r, w))
        {
            return Some(found);
        }
    }
    ["items", "additionalProperties"].iter().find_map(|keyword| {
        match (read.get(*keyword), written.get(*keyword)) {
            (Some(r), Some(w)) => read_not_written(r, w),
            _ => None,
        }
    })
}

#[derive(Clone)]
struct Entry {
    tool: Arc<dyn DynTool>,
    definition: ToolDefinition,
}

/// A set of tools a model may call, by name with JSON arguments. Cheap to clone.
///
/// ```
/// # use idem_core::{Idem, ToolSet};
/// # async fn demo(tools: ToolSet) {
/// let idem = Idem::in_memory();
/// let run = idem.run("conversation-42");
/// let call = serde_json::json!({"type": "tool_use", "id": "toolu_1", "name": "get_balance",
///                               "input": {"customer": "cus_1"}});
/// let block = tools.call_anthropic(&run, &call).await; // {"type":"tool_result", ...}
/// # }
/// ```
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: BTreeMap<&'static str, Entry>,
    cx: DispatchContext,
    /// Tools a `#[tool_set]` block could not add, by name, with why.
    refused: BTreeMap<&'static str, ToolSetError>,
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSet").field("tools", &self.tools.keys()).finish()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

fn valid_argument_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        ToolSet::default()
    }

    /// This set with `tool` added. Errors: [`ToolSetError`] (duplicate or invalid name, arguments
    /// that are not an object, combine schemas at their root, or have a name model APIs refuse).
    pub fn with(mut self, tool: impl Tool) -> Result<Self, ToolSetError> {
        self.add(tool)?;
        Ok(self)
    }

    /// Adds `tool`. Errors: see [`ToolSet::with`]; the set is unchanged on error.
    pub fn add(&mut self, tool: impl Tool) -> Result<(), ToolSetError> {
        self.add_dyn(Arc::new(tool))
    }

    /// Adds a tool already behind the object-safe adapter.
    pub fn add_dyn(&mut self, tool: Arc<dyn DynTool>) -> Result<(), ToolSetError> {
        let def = tool.tool_def();
        if !valid_name(def.name) {
            return Err(ToolSetError::InvalidName(def.name));
        }
        if self.tools.contains_key(def.name) {
            return Err(ToolSetError::DuplicateName(def.name));
        }
        let input_schema = tool.input_schema();
        if let Some(member) = read_not_written(&input_schema, &tool.written_schema()) {
            let property = crate::printable(&member).into_owned();
            return Err(ToolSetError::ReadButNotKeyed { tool: def.name, property });
        }
        let mut input_schema = match input_schema {
            Value::Object(schema) if schema.get("type") == Some(&Value::from("object")) => schema,
            _ => return Err(ToolSetError::NotAnObject(def.name)),
        };
        if let Some(keyword) =
            ["oneOf", "anyOf", "allOf"].into_iter().find(|k| input_schema.contains_key(*k))
        {
            return Err(ToolSetError::CombinedAtRoot { tool: def.name, keyword });
        }
        if let Some(Value::Object(properties)) = input_schema.get("properties")
            && let Some(name) = properties.keys().find(|k| !valid_argument_name(k))
        {
            let property = crate::printable(name).into_owned();
            return Err(ToolSetError::InvalidArgumentName { tool: def.name, property });
        }
        host_readable(&mut input_schema);
        // A tool without arguments (schemars writes `{"type": "object"}` for an empty struct)
        // still names its properties, as none: OpenAI's function validation refuses an object
        // schema without `properties` ("object schema missing properties"), failing the whole
        // request that lists the tool, and MCP hosts that validate strictly (GitHub Copilot, n8n)
        // refuse the tool. `{}` adds no constraint.
        input_schema.entry("properties").or_insert_with(|| Value::Object(Map::new()));
        let definition = ToolDefinition {
            name: def.name,
            description: def.description,
            class: def.class,
            input_schema,
            annotations: Annotations::for_class(def.class),
        };
        self.insert(Entry { tool, definition });
        Ok(())
    }

    /// Puts a checked tool of a name not in the set into it (`add_dyn`, `merge`).
    fn insert(&mut self, entry: Entry) {
        let name = entry.definition.name;
        if entry.definition.class == RetryClass::Safe {
            self.cx.read_only.push(name);
            self.cx.read_only.sort_unstable();
        }
        if !same_key::may_read_a_number_two_ways(&entry.definition.input_schema) {
            self.cx.one_number_reading.push(name);
            self.cx.one_number_reading.sort_unstable();
        }
        self.tools.insert(name, entry);
        // A `#[tool_set]` block may have left out a tool of this name: the set holds one now, and
        // calls of the name run it, so the refusal no longer says anything true.
        self.refused.remove(name);
    }

    /// This set with every tool of `other` added: the sets of two `#[tool_set]` blocks, or one
    /// and free tools. `other`'s [`refusals`](Self::refusals) are kept, except for a name the
    /// merged set holds a tool of. Errors: [`ToolSetError::DuplicateName`] when both sets hold a
    /// tool of that name; nothing is merged then.
    pub fn merge(mut self, other: ToolSet) -> Result<Self, ToolSetError> {
        if let Some(name) = other.tools.keys().find(|name| self.tools.contains_key(*name)) {
            return Err(ToolSetError::DuplicateName(name));
        }
        for entry in other.tools.into_values() {
            self.insert(entry);
        }
        for (name, refusal) in other.refused {
            if !self.tools.contains_key(name) {
                self.refused.entry(name).or_insert(refusal);
            }
        }
        Ok(self)
    }

    /// Adds `tool`, or keeps why it cannot be added (`#[tool_set]`'s generated `tool_set()`,
    /// which returns the set itself): the refusal is logged at error level, listed by
    /// [`refusals`](Self::refusals), and a call of that name answers with it instead of
    /// "unknown tool". A tool name or a schema that no model API accepts is a mistake in the
    /// types, the same every time the set is built.
    #[doc(hidden)]
    pub fn add_or_keep_refusal(&mut self, tool: impl Tool) {
        let name = tool.def().name;
        if let Err(refusal) = self.add(tool) {
            tracing::error!(tool = name, error = %refusal, "a tool was left out of its tool set");
            self.refused.insert(name, refusal);
        }
    }

    /// The tools a `#[tool_set]` block could not add, with why (a name or an arguments schema
    /// that model APIs refuse: [`ToolSetError`]). Empty when every tool is in the set; check it
    /// when the server starts, or in a test.
    pub fn refusals(
        &self,
    ) -> impl ExactSizeIterator<Item = &ToolSetError> + Clone + std::fmt::Debug {
        self.refused.values()
    }

    /// Why `name` is not in the set, when a `#[tool_set]` block could not add it.
    pub fn refusal(&self, name: &str) -> Option<&ToolSetError> {
        self.refused.get(name)
    }

    /// The definitions, sorted by name.
    pub fn definitions(&self) -> impl Iterator<Item = &ToolDefinition> {
        self.tools.values().map(|e| &e.definition)
    }

    /// The definition of `name`, if it is in the set.
    pub fn definition(&self, name: &str) -> Option<&ToolDefinition> {
        self.tools.get(name).map(|e| &e.definition)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Calls `name` with arguments as parsed JSON, in `run` (the key scope).
    pub async fn call(&self, run: &Run, name: &str, args: &Value) -> ToolResult {
        self.call_args(run, name, Arguments::Json(args)).await
    }

    /// Calls `name` with arguments as JSON text, in `run`.
    pub async fn call_text(&self, run: &Run, name: &str, args: &str) -> ToolResult {
        self.call_args(run, name, Arguments::Text(args)).await
    }

    /// A model's call once its envelope is read: refused (`refused`, or why it has no name)
    /// with nothing run, or dispatched by name under the call id `id` (traced, not part of the
    /// key). An envelope fault is reported before a missing name: a call of another type or API
    /// says so rather than that it lacks a name.
    async fn call_envelope(
        &self,
        run: &Run,
        id: &str,
        refused: Option<String>,
        name: Result<&str, String>,
        args: Arguments<'_>,
    ) -> ToolResult {
        match (name, refused) {
            (_, Some(why)) | (Err(why), None) => invalid_call(why),
            (Ok(name), None) => self.call_args(&with_call_id(run, id), name, args).await,
        }
    }

    /// Calls `name` with `args`, in `run`. An unknown name is a result of kind [`ErrorKind::UnknownTool`]
    /// listing the available tools.
    pub async fn call_args(&self, run: &Run, name: &str, args: Arguments<'_>) -> ToolResult {
        match self.tools.get(name) {
            Some(entry) => entry.tool.dispatch(run, args, &self.cx).await,
            None => self.unknown_tool(name),
        }
    }

    fn unknown_tool(&self, name: &str) -> ToolResult {
        if let Some(refusal) = self.refusal(name) {
            return ToolResult::error(
                ErrorKind::UnknownTool,
                format!("the tool `{name}` is not available ({refusal}); nothing was executed"),
                None,
            );
        }
        let available: Vec<&str> = self.tools.keys().copied().collect();
        ToolResult::error(
            ErrorKind::UnknownTool,
            format!(
                "there is no tool named `{}`; nothing was executed. Available tools: {}",
                shown(name, mcp::SHOWN_NAME_CHARS),
                available.join(", ")
            ),
            None,
        )
    }
}

/// The id of a model's tool call (OpenAI `tool_calls[i].id`, Responses `call_id`, Anthropic
/// `tool_use.id`; `field` names it), and why one that is present but not a string is refused:
/// the result must carry the id back for the host to match it to its call, and a number would
/// come back as another id. Such an id is echoed as its JSON text, unless it nests past the depth
/// limit (serde_json would overflow the stack writing it): then as none. An absent id is empty.
fn call_id(id: Option<&Value>, field: &str) -> (String, Option<String>) {
    match id {
        None | Some(Value::Null) => (String::new(), None),
        Some(Value::String(id)) => (id.clone(), None),
        Some(other) => (
            crate::limits::check_value_depth(other)
                .map_or_else(|_| String::new(), |()| other.to_string()),
            Some(format!(
                "the tool call's {field} is {}, not a string; nothing was executed. Send the id as a string",
                crate::json_text::kind(other)
            )),
        ),
    }
}

/// The tool name of a model's call, or why a missing or non-string one is refused (`field` names
/// where it belongs).
fn call_name<'a>(name: Option<&'a Value>, field: &str) -> Result<&'a str, String> {
    match name {
        Some(Value::String(name)) => Ok(name),
        None | Some(Value::Null) => {
            Err(format!("the tool call has no {field}; nothing was executed"))
        }
        Some(other) => Err(format!(
            "the tool call's {field} is {}, not a string; nothing was executed. Send the tool's name as a string",
            crate::json_text::kind(other)
        )),
    }
}

/// Why a model's `call` whose `type` names another kind of block or call than `expected` is
/// refused: an Anthropic `server_tool_use` or `mcp_tool_use` block was run by Anthropic already,
/// so running a local tool of the same name would do its effect a second time. A call without a
/// `type` (written by hand) is taken as `expected`, unless it is a Gemini part.
fn wrong_type(call: &Value, expected: &str) -> Option<String> {
    if call.get("functionCall").is_some() {
        return Some(
            "the tool call is a Gemini `functionCall` part; nothing was executed (dispatch it \
             with `ToolSet::call_gemini`)"
                .into(),
        );
    }
    match call.get("type") {
        None | Some(Value::Null) => None,
        Some(Value::String(kind)) if kind == expected => None,
        Some(Value::String(kind)) => Some(format!(
            "the tool call's `type` is \"{}\", not \"{expected}\"; nothing was executed{}",
            shown(kind, SHOWN_WORD_CHARS),
            other_type_hint(kind)
        )),
        Some(other) => Some(format!(
            "the tool call's `type` is {}, not the string \"{expected}\"; nothing was executed",
            crate::json_text::kind(other)
        )),
    }
}

/// Text a model sent (a tool name, a `type`, a `status`, a member's name) as an error message
/// shows it: at most `max` characters, then `…`, escaped with [`crate::printable`] (the message
/// may end up on an operator's terminal or in a log).
fn shown(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => crate::printable(text),
        Some((end, _)) => format!("{}…", crate::printable(&text[..end])).into(),
    }
}

/// The longest word other than a tool name ([`mcp::SHOWN_NAME_CHARS`]) that a message repeats:
/// a `type`, a `status`, a member's name.
const SHOWN_WORD_CHARS: usize = 64;

/// What a refused `type` most likely is: a call the provider ran itself (Anthropic server tools
/// and remote MCP, OpenAI's hosted tools), or a client call in another API's shape, with the
/// dispatcher that takes it.
fn other_type_hint(kind: &str) -> &'static str {
    const HOSTED: [&str; 5] = [
        "mcp_call",
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
    ];
    match kind {
        "function" => " (an OpenAI chat completions call: dispatch it with `ToolSet::call_openai`)",
        "function_call" => {
            " (an OpenAI Responses item: dispatch it with `ToolSet::call_openai_responses`)"
        }
        "tool_use" => " (an Anthropic block: dispatch it with `ToolSet::call_anthropic`)",
        _ if kind.ends_with("_tool_use") || HOSTED.contains(&kind) => {
            " (the provider runs such a call itself)"
        }
        _ => "",
    }
}

/// The result of a tool call refused for its envelope (`why`): nothing ran.
fn invalid_call(why: String) -> ToolResult {
    ToolResult::error(ErrorKind::InvalidToolCall, why, None)
}

fn with_call_id(run: &Run, id: &str) -> Run {
    if id.is_empty() { run.clone() } else { run.with_call_id(id) }
}
