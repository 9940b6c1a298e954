use std::sync::Arc;

use idem_core::Ctx;

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
pub struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

#[derive(Default)]
pub struct Payments;

#[idem_core::tool_set]
impl Payments {
    /// Charge a card.
    #[tool(retry = "keyed")]
    pub async fn charge(&self, cx: &Ctx, amount_cents: u64) -> Result<String, Failed> {
        Ok(format!("{amount_cents}:{}", cx.key()))
    }

    /// Not compiled here: not in the set either.
    #[cfg(any())]
    #[tool(retry = "safe")]
    pub async fn gone(&self) -> Result<u64, Failed> {
        Ok(0)
    }

    #[idem_core::tool(retry = "safe", description = "Read the balance.")]
    async fn balance(&self) -> Result<u64, Failed> {
        Ok(0)
    }

    const CURRENCY: &str = "EUR";

    fn currency(&self) -> &'static str {
        Self::CURRENCY
    }
}

fn main() {
    let set: idem_core::ToolSet = Arc::new(Payments).tool_set();
    assert_eq!(set.len(), 2);
    let _ = Payments.currency();
    versions::check();
    let _ = Arc::new(bounded::Shout { f: |s: &str| s.to_uppercase() }).tool_set();
    assert_eq!(Arc::new(conditional::Traced).tool_set().len(), 2);
    let flagged = Arc::new(conditional::Flagged);
    let set = flagged.tool_set();
    assert_eq!(set.len(), 2);
    assert!(set.definition("on").is_some() && set.definition("nested").is_some());
    let _ = (flagged.on_tool(), flagged.off(1, None));
    let set = Arc::new(conditional::EitherWay).tool_set();
    assert!(set.definition("either").is_some());
}

/// `tool_set` has the visibility of the most visible tool, whatever their order: a private tool
/// first and a `pub(crate)` one after it once made `tool_set` private to this module.
mod ordered {
    use super::Failed;

    pub struct Orders;

    #[idem_core::tool_set]
    impl Orders {
        #[tool(retry = "safe")]
        async fn private_first(&self) -> Result<u64, Failed> {
            Ok(0)
        }

        #[tool(retry = "safe")]
        pub(crate) async fn crate_visible(&self) -> Result<u64, Failed> {
            Ok(0)
        }
    }

    /// Where `ordered_visible` can be called, so can `tool_set`.
    pub fn drafts() -> idem_core::ToolSet {
        std::sync::Arc::new(nested::deeper::Drafts).tool_set()
    }

    /// `pub(super)` or `pub(self)` first reaches less than `pub(crate)` after it.
    pub mod nested {
        use super::Failed;

        pub struct Refunds;

        #[idem_core::tool_set]
        impl Refunds {
            #[tool(retry = "safe")]
            pub(super) async fn parent_visible(&self) -> Result<u64, Failed> {
                Ok(0)
            }

            #[tool(retry = "safe")]
            pub(crate) async fn crate_visible(&self) -> Result<u64, Failed> {
                Ok(0)
            }
        }

        /// Two restricted to different modules: `pub(in crate::ordered)` reaches further than
        /// `pub(super)` written first here, in `deeper`.
        pub mod deeper {
            use super::Failed;

            pub struct Drafts;

            #[idem_core::tool_set]
            impl Drafts {
                #[tool(retry = "safe")]
                pub(super) async fn parent_visible(&self) -> Result<u64, Failed> {
                    Ok(0)
                }

                #[tool(retry = "safe")]
                pub(in crate::ordered) async fn ordered_visible(&self) -> Result<u64, Failed> {
                    Ok(0)
                }
            }
        }

        pub struct Notes;

        #[idem_core::tool_set]
        impl Notes {
            #[tool(retry = "safe")]
            pub(self) async fn private(&self) -> Result<u64, Failed> {
                Ok(0)
            }

            #[tool(retry = "safe")]
            pub(crate) async fn crate_visible(&self) -> Result<u64, Failed> {
                Ok(0)
            }
        }
    }
}

pub fn from_outside() -> idem_core::ToolSet {
    Arc::new(ordered::Orders).tool_set();
    Arc::new(ordered::nested::Refunds).tool_set();
    Arc::new(ordered::nested::Notes).tool_set()
}

/// Two versions of one tool under exclusive `#[cfg]`s share its name: only one is compiled, so
/// this is no duplicate.
mod versions {
    use super::Failed;

    pub struct Lookup;

    #[idem_core::tool_set]
    impl Lookup {
        #[cfg(any())]
        #[tool(retry = "safe", name = "lookup")]
        pub async fn lookup_v2(&self, id: u64) -> Result<u64, Failed> {
            Ok(id * 2)
        }

        #[cfg(not(any()))]
        #[tool(retry = "safe", name = "lookup")]
        pub async fn lookup_v1(&self, id: u64) -> Result<u64, Failed> {
            Ok(id)
        }
    }

    pub fn check() {
        let set = std::sync::Arc::new(Lookup).tool_set();
        assert_eq!(set.len(), 1);
        assert!(set.definition("lookup").is_some());
    }
}

/// An inherent block whose bound is higher-ranked: its `for<'a>` does not make it a trait impl.
mod bounded {
    use super::Failed;

    pub struct Shout<F> {
        pub f: F,
    }

    #[idem_core::tool_set]
    impl<F> Shout<F>
    where
        F: for<'a> Fn(&'a str) -> String + Send + Sync + 'static,
    {
        #[tool(retry = "safe")]
        pub async fn shout(&self, text: String) -> Result<String, Failed> {
            Ok((self.f)(&text))
        }
    }
}

/// A method's `cfg_attr` goes where the attribute it applies goes: an `instrument` on the body
/// only (not on the typed call, the tool value or the statement adding it to the set), and a
/// `cfg` it applies on all of them.
mod conditional {
    use super::Failed;

    pub struct Traced;

    #[idem_core::tool_set]
    impl Traced {
        #[tool(retry = "safe")]
        #[cfg_attr(all(), tracing::instrument(skip(self), err))]
        pub async fn traced(&self, n: u32) -> Result<u32, Failed> {
            Ok(n)
        }

        #[tool(retry = "safe")]
        #[cfg_attr(all(), cfg_attr(all(), expect(unused_variables)), doc = "Described.")]
        pub async fn noted(&self, n: u32, note: String) -> Result<u32, Failed> {
            Ok(n)
        }

        #[tool(retry = "safe")]
        #[cfg_attr(all(), cfg(any()))]
        pub async fn gone(&self, n: u32) -> Result<u32, Failed> {
            Ok(n)
        }
    }

    /// A `#[tool]` applied by a `cfg_attr` is in the set under its condition (rustc would apply
    /// it after the block is read, outside the set), and the method a plain one otherwise.
    pub struct Flagged;

    #[idem_core::tool_set]
    impl Flagged {
        #[cfg_attr(all(), tool(retry = "safe"))]
        pub async fn on(&self, n: u32) -> Result<u32, Failed> {
            Ok(n)
        }

        // Its parameters' docs and `#[idem(..)]` are the tool's, dropped from the plain method.
        #[cfg_attr(any(), tool(retry = "safe"))]
        pub async fn off(
            &self,
            /// How many.
            n: u32,
            #[idem(skip_if_none)] memo: Option<String>,
        ) -> Result<u32, Failed> {
            Ok(n + u32::from(memo.is_some()))
        }

        #[cfg_attr(all(), cfg_attr(all(), tool(retry = "keyed", name = "nested")), doc = "Nested.")]
        pub async fn nested_one(&self, n: u32) -> Result<u32, Failed> {
            Ok(n)
        }
    }

    /// A tool in either case, with a retry class per case: the second `cfg_attr` holds where
    /// the first does not, on the method left without the first's tool.
    pub struct EitherWay;

    #[idem_core::tool_set]
    impl EitherWay {
        #[cfg_attr(any(), tool(retry = "never"))]
        #[cfg_attr(not(any()), tool(retry = "safe"))]
        pub async fn either(&self, n: u32) -> Result<u32, Failed> {
            Ok(n)
        }
    }
}
