//! A `HashSet` written in a parameter's type (alone or inside another type) is one error at it:
//! its members' order differs between two copies, so it cannot be part of a key. Marked
//! `#[idem(skip)]` it is not part of the key, and is accepted. The typed calls still type-check.
use std::collections::{BTreeSet, HashSet};

use idem_core::{Idem, NoError, tool};

/// Tags a customer.
#[tool(retry = "keyed")]
async fn tag(customer: String, tags: HashSet<String>) -> Result<usize, NoError> {
    Ok(customer.len() + tags.len())
}

/// Labels an order.
#[tool(retry = "keyed")]
async fn label(labels: Option<Vec<std::collections::HashSet<u32>>>) -> Result<usize, NoError> {
    Ok(labels.map_or(0, |l| l.len()))
}

/// Tags with a set that is not part of the intent, and an ordered one that is.
#[tool(retry = "keyed")]
async fn retag(
    #[idem(skip)] seen: HashSet<String>,
    tags: BTreeSet<String>,
) -> Result<usize, NoError> {
    Ok(seen.len() + tags.len())
}

#[tokio::main]
async fn main() {
    let run = Idem::in_memory().run("r");
    let _ = tag(&run, "c".into(), HashSet::new()).await;
    let _ = label(&run, None).await;
    let _ = retag(&run, HashSet::new(), BTreeSet::new()).await;
}
