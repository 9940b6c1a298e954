//! Tools written by a `macro_rules!` macro (method and check names from its arguments), a
//! parameter type with its own lifetime, and lint attributes, under `deny(warnings)`: the
//! expansion adds no warning of its own and honours the user's `allow`s.
#![deny(warnings)]

use std::borrow::Cow;
use std::sync::Arc;

use idem_core::{Key, Reconciled, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

macro_rules! service {
    ($service:ident, $method:ident, $free:ident, $check:ident) => {
        pub struct $service;

        #[idem_core::tool_set]
        impl $service {
            #[tool(retry = "never", reconcile = $check)]
            pub async fn $method(&self, x: u32) -> Result<u32, Failed> {
                Ok(x)
            }

            async fn $check(&self, _key: &Key, x: u32) -> Reconciled<u32> {
                Reconciled::Happened(x)
            }
        }

        async fn $check(_key: &Key, x: u32) -> Reconciled<u32> {
            Reconciled::Happened(x)
        }

        #[tool(retry = "never", reconcile = $check)]
        pub async fn $free(x: u32) -> Result<u32, Failed> {
            Ok(x)
        }
    };
}

service!(Ledger, post, post_free, posted);

/// A parameter type that names its own lifetime.
#[tool(retry = "safe")]
pub async fn greet(name: Cow<'static, str>, run_note: Option<Cow<'static, str>>) -> Result<String, Failed> {
    Ok(format!("{name}{}", run_note.unwrap_or_default()))
}

/// A JSON field in camelCase is a parameter in camelCase: the user's `allow` is enough.
#[allow(non_snake_case)]
#[tool(retry = "safe")]
pub async fn lookup(userId: String) -> Result<String, Failed> {
    Ok(userId)
}

#[tool(retry = "safe")]
pub async fn lookup_param(#[allow(non_snake_case)] customerId: String) -> Result<String, Failed> {
    Ok(customerId)
}

/// A tool that cannot fail.
#[tool(retry = "safe")]
pub async fn now_ms() -> Result<u64, idem_core::NoError> {
    Ok(0)
}

/// A context taken and not used needs no name.
#[tool(retry = "keyed")]
pub async fn unused_context(_: &idem_core::Ctx, n: u32) -> Result<u32, Failed> {
    Ok(n)
}

#[deprecated(note = "use `greet`")]
#[tool(retry = "safe")]
pub async fn hello(name: String) -> Result<String, Failed> {
    Ok(name)
}

/// `#[expect]` on a method tool and on its parameter: fulfilled by the body, and not reported
/// unfulfilled on the typed call, which repeats the names and uses every parameter.
pub struct Desk;

impl Desk {
    #[tool(retry = "safe")]
    pub async fn file(
        &self,
        n: u32,
        #[expect(unused_variables)] note: String,
    ) -> Result<u32, Failed> {
        Ok(n)
    }

    #[expect(unused_variables)]
    #[tool(retry = "safe")]
    pub async fn shelve(&self, n: u32, note: String) -> Result<u32, Failed> {
        Ok(n)
    }
}

/// A tool named in camelCase (a JSON-facing name kept as written), allowed by the user: no
/// generated item named after it warns either.
#[allow(non_snake_case)]
#[tool(retry = "safe")]
pub async fn getUser(userId: String) -> Result<String, Failed> {
    Ok(userId)
}

impl Desk {
    #[allow(non_snake_case)]
    #[tool(retry = "safe")]
    pub async fn findUser(&self, userId: String) -> Result<String, Failed> {
        Ok(userId)
    }
}

/// Local types named `str` and `u16` do not change what the expansion means by them.
mod shadowing {
    #[allow(non_camel_case_types, dead_code)]
    pub struct str;

    #[allow(non_camel_case_types, dead_code)]
    pub struct u16;

    /// Described.
    #[idem_core::tool(retry = "safe")]
    pub async fn shadowed(
        /// A number.
        n: u32,
        #[idem(skip)] trace: u32,
        #[idem(skip_if_none)] memo: Option<u32>,
    ) -> Result<u32, super::Failed> {
        Ok(n + trace + memo.unwrap_or(0))
    }
}

fn main() {
    let idem = idem_core::Idem::in_memory();
    let run = idem.run("r");
    let ledger = Arc::new(Ledger);
    let _ = ledger.post(&run, 1);
    let _ = ledger.tool_set();
    let desk = Arc::new(Desk);
    let _ = (desk.file(&run, 1, "n".into()), desk.shelve(&run, 1, "n".into()));
    let _ = post_free(&run, 1);
    let _ = greet(&run, Cow::Borrowed("a"), None);
    let _ = lookup(&run, "u".into());
    let _ = lookup_param(&run, "c".into());
    let _ = getUser(&run, "u".into());
    let _ = (desk.findUser(&run, "u".into()), desk.findUser_tool());
    let _ = unused_context(&run, 1);
    let _ = now_ms(&run);
    #[allow(deprecated)]
    let _ = hello(&run, "h".into());
    let _ = (GreetTool, LookupTool, LookupParamTool, PostFreeTool, shadowing::ShadowedTool);
}
