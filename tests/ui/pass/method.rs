use std::sync::{Arc, Mutex};

use idem_core::{Ctx, Idem, Tool, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Default)]
pub struct Payments {
    charges: Mutex<Vec<u64>>,
}

impl Payments {
    /// Charge a card.
    #[tool(retry = "keyed")]
    pub async fn charge(&self, cx: &Ctx, amount_cents: u64) -> Result<usize, Failed> {
        let _ = cx.key();
        let mut charges = self.charges.lock().unwrap();
        charges.push(amount_cents);
        Ok(charges.len())
    }

    /// Read the number of charges.
    #[tool(retry = "safe")]
    pub async fn count(&self) -> Result<usize, Failed> {
        Ok(self.charges.lock().unwrap().len())
    }

    /// A plain method next to tools.
    pub fn new() -> Self {
        Self::default()
    }
}

pub struct Generic<C> {
    client: C,
}

impl<C: Clone + Send + Sync + ToString + 'static> Generic<C> {
    #[tool(retry = "safe")]
    async fn describe(&self, prefix: String) -> Result<String, Failed> {
        Ok(format!("{prefix}{}", self.client.to_string()))
    }
}

fn takes_tool<T: Tool>(tool: T) -> &'static str {
    tool.def().name
}

fn main() {
    let payments = Arc::new(Payments::new());
    assert_eq!(takes_tool(payments.charge_tool()), "charge");
    assert_eq!(takes_tool(payments.count_tool()), "count");
    let generic = Arc::new(Generic { client: 7u8 });
    assert_eq!(takes_tool(generic.describe_tool()), "describe");
    let run = Idem::in_memory().run("r");
    let _future = payments.charge(&run, 100);
}
