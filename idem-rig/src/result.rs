//! How one idem [`ToolResult`] becomes what a rig agent hands back to the model.
//!
//! A success is the tool's output (a JSON string as text, as `""` when empty or blank, anything
//! else as a JSON block with its members sorted by name, as rig's own `IntoToolOutput` presents
//! a value). A failure is a [`ToolExecutionError`] whose
//! model-visible text is idem's text, unchanged (`Error (<kind>): <message>`), whose `code` is
//! idem's stable `error_kind`, and whose rig kind and retryability hint follow the table on
//! [`tool_error`].

use idem_core::{ErrorKind, ToolResult};
use rig_core::tool::{ToolErrorKind, ToolExecutionError, ToolOutput};
use serde_json::Value;

/// The outcome of one idem call in rig's terms: `Ok` with the output the model reads, or the
/// error rig records as a failed tool result (the model reads [`ToolResult::text`]).
pub fn to_rig(result: ToolResult) -> Result<ToolOutput, ToolExecutionError> {
    if !result.is_error {
        return Ok(match result.content {
            // idem's text of a string: itself, or `""` for an empty or blank one, which a
            // provider's API would refuse as a text block (`ToolResult::text`).
            Value::String(_) => ToolOutput::text(result.text),
            // Members sorted by name (`ToolResult::success`), so that a replay gives the model
            // the block its first call did, also under rig-core's `preserve_order`.
            other => ToolOutput::json(other),
        });
    }
    Err(tool_error(&result))
}

/// The rig error for a failed idem call. The model reads `result.text`; `code` is idem's
/// `error_kind`. Kinds and retryability hints (rig-agent does not retry a tool by itself; the
/// hint is for hosts and telemetry):
///
/// | idem `error_kind` | rig kind | retryable |
/// |---|---|---|
/// | `invalid_arguments`, `invalid_tool_call` | `InvalidArgs` | no: fix the arguments |
/// | `unknown_tool` | `NotFound` | no |
/// | `timeout` | `Timeout` | yes: a repeat reuses the key |
/// | `budget_exhausted` | `RateLimited` | yes, later |
/// | `store_unavailable` | `Network` | yes, when the store is back (nothing ran) |
/// | `lease_lost` | `Other` | yes: a repeat returns the new owner's result |
/// | `stopped_waiting` | `Other` | yes: a repeat returns the result of the call it waited for |
/// | `tool_error` | `Provider` | as the result's `error.retryable`: no for a permanent error (stored and replayed), yes for the last of transient or ambiguous failures (nothing stored; a repeat runs again) |
/// | `outcome_unknown`, `key_reuse_mismatch`, `replay_failed`, `output_not_json`, `tool_panicked`, others | `Other` | no |
pub fn tool_error(result: &ToolResult) -> ToolExecutionError {
    let (kind, retryable) = match result.error_kind {
        Some(ErrorKind::InvalidArguments | ErrorKind::InvalidToolCall) => {
            (ToolErrorKind::InvalidArgs, false)
        }
        Some(ErrorKind::UnknownTool) => (ToolErrorKind::NotFound, false),
        Some(ErrorKind::Timeout) => (ToolErrorKind::Timeout, true),
        Some(ErrorKind::BudgetExhausted) => (ToolErrorKind::RateLimited, true),
        Some(ErrorKind::StoreUnavailable) => (ToolErrorKind::Network, true),
        Some(ErrorKind::LeaseLost | ErrorKind::StoppedWaiting) => (ToolErrorKind::Other, true),
        Some(ErrorKind::Tool) => {
            let retryable = result.content["error"]["retryable"].as_bool().unwrap_or(false);
            (ToolErrorKind::Provider, retryable)
        }
        _ => (ToolErrorKind::Other, false),
    };
    let code = result.error_kind.map_or("error", ErrorKind::as_str);
    // `new` shows the message to the model as it is: idem's text already says what happened
    // and what to do (for an unknown outcome: do not call again, check).
    ToolExecutionError::new(kind, result.text.clone()).with_code(code).with_retryable(retryable)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn outputs_keep_their_shape() {
        let out = to_rig(ToolResult::success(json!({"charge_id": "ch_1"}))).unwrap();
        assert_eq!(out.as_json(), Some(&json!({"charge_id": "ch_1"})));
        // Members sorted by name at every level, whatever order the output came in.
        let given: Value = serde_json::from_str(r#"{"b":[{"d":1,"c":2}],"a":0}"#).unwrap();
        let out = to_rig(ToolResult::success(given)).unwrap();
        let written = serde_json::to_string(out.as_json().unwrap()).unwrap();
        assert_eq!(written, r#"{"a":0,"b":[{"c":2,"d":1}]}"#);
        let out = to_rig(ToolResult::success(json!("done"))).unwrap();
        assert_eq!(out.as_text(), Some("done"));
        // Never an empty text block: Anthropic's API refuses one, with the whole request.
        let out = to_rig(ToolResult::success(json!(""))).unwrap();
        assert_eq!(out.as_text(), Some(r#""""#));
    }

    #[test]
    fn errors_show_idem_text_and_kind() {
        let cases = [
            (ErrorKind::InvalidArguments, ToolErrorKind::InvalidArgs, Some(false)),
            (ErrorKind::OutcomeUnknown, ToolErrorKind::Other, Some(false)),
            (ErrorKind::KeyReuseMismatch, ToolErrorKind::Other, Some(false)),
            (ErrorKind::Timeout, ToolErrorKind::Timeout, Some(true)),
            (ErrorKind::StoreUnavailable, ToolErrorKind::Network, Some(true)),
            (ErrorKind::StoppedWaiting, ToolErrorKind::Other, Some(true)),
            (ErrorKind::Tool, ToolErrorKind::Provider, Some(false)),
        ];
        for (idem_kind, rig_kind, retryable) in cases {
            let result = ToolResult::error(idem_kind, "what happened; what to do", None);
            let err = to_rig(result.clone()).unwrap_err();
            let code = idem_kind.as_str();
            assert_eq!(err.kind(), rig_kind, "{code}");
            assert_eq!(err.code(), Some(code));
            assert_eq!(err.retryable(), retryable, "{code}");
            assert_eq!(err.model_feedback(), Some(result.text.as_str()));
            assert!(result.text.starts_with(&format!("Error ({code}): ")));
        }
    }

    #[test]
    fn a_tool_error_is_retryable_as_its_result_says() {
        for retryable in [true, false] {
            let mut result =
                ToolResult::error(ErrorKind::Tool, "`charge` failed: unreachable", None);
            result.content["error"]["retryable"] = json!(retryable);
            assert_eq!(to_rig(result).unwrap_err().retryable(), Some(retryable));
        }
    }
}
