//! A parameter whose name Anthropic's API refuses as a property key (beyond ASCII, or longer than
//! 64 characters): one error at the name, at compile time instead of a refusal by `ToolSet`; the
//! call sites type-check.
use idem_core::{NoError, tool};

/// Order a box.
#[tool(retry = "safe")]
pub async fn order_box(größe: u32) -> Result<u32, NoError> {
    Ok(größe)
}

pub struct Shop;

#[idem_core::tool_set]
impl Shop {
    /// Weigh a parcel.
    #[tool(retry = "safe")]
    pub async fn weigh(
        &self,
        the_weight_of_the_parcel_in_grams_as_read_from_the_scale_at_the_desk: u32,
    ) -> Result<u32, NoError> {
        Ok(the_weight_of_the_parcel_in_grams_as_read_from_the_scale_at_the_desk)
    }
}

fn main() {
    let run = idem_core::Idem::in_memory().run("r");
    let _ = order_box(&run, 3);
    let shop = std::sync::Arc::new(Shop);
    let _ = shop.weigh(&run, 3);
    let _ = shop.tool_set();
}
