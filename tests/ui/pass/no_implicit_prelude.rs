//! Tools in a `#[no_implicit_prelude]` module: the expansion names everything by its full path,
//! traits included (a method tool's receiver is cloned as `<Arc<Self> as Clone>::clone`).

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

#[no_implicit_prelude]
mod bare {
    use ::idem_core::{Ctx, Key, Reconciled, Run, ToolSet};
    use ::std::option::Option;
    use ::std::result::Result;
    use ::std::string::String;

    /// Described, with a [`Ledger`] link.
    #[::idem_core::tool(retry = "keyed", timeout = "1s", attempts = 3)]
    pub async fn charge(
        cx: &Ctx,
        customer: String,
        #[idem(skip)] trace: u32,
        #[idem(skip_if_none)] memo: Option<u32>,
    ) -> Result<String, super::Failed> {
        let _ = (cx, trace, memo);
        Result::Ok(customer)
    }

    async fn posted(_key: &Key, n: u32) -> Reconciled<u32> {
        Reconciled::Happened(n)
    }

    #[::idem_core::tool(retry = "never", reconcile = posted)]
    pub async fn post(
        /// How many.
        n: u32,
    ) -> Result<u32, super::Failed> {
        Result::Ok(n)
    }

    pub struct Ledger;

    #[::idem_core::tool_set]
    impl Ledger {
        #[tool(retry = "never", deadline = "3s", reconcile = entered)]
        pub async fn enter(&self, cx: &Ctx, n: u32) -> Result<u32, super::Failed> {
            let _ = cx;
            Result::Ok(n)
        }

        async fn entered(&self, _key: &Key, n: u32) -> Reconciled<u32> {
            Reconciled::Happened(n)
        }
    }

    pub fn calls(run: &Run) -> ToolSet {
        let _ = charge(run, String::new(), 1, Option::None);
        let _ = post(run, 1);
        let ledger = ::std::sync::Arc::new(Ledger);
        let _ = ledger.enter(run, 1);
        ledger.tool_set()
    }
}

fn main() {
    let _ = (bare::ChargeTool, bare::PostTool, bare::calls);
}
