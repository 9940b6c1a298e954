//! Indented tools that `#[tool]` must not take for ones in a block that cannot hold them: it
//! reads the source file to find the block around an indented fn, and nothing here may fool it.
use idem_core::{Idem, NoError, tool};

pub struct Desk;

impl Desk {
    /// Length in inches.
    #[tool(retry = "safe", description = r#"Length in inches (")"#)]
    #[doc = r"Files live under C:\"]
    pub async fn measure(&self, x: u32) -> Result<u32, NoError> {
        Ok(x)
    }
}

pub struct Wrap<F>(pub F);

impl<F> Wrap<F>
where
    for /* any lifetime */ <'a> F: Fn(&'a str) -> usize + Send + Sync + 'static,
{
    /// A method tool after a bound whose `for` and `<` a comment separates.
    #[tool(retry = "safe")]
    pub async fn length(&self, s: String) -> Result<usize, NoError> {
        Ok((self.0)(&s))
    }
}

/// A type with a lifetime, all of whose values are `'static`.
pub struct Named<'a>(pub &'a str);

impl Named<'static> {
    /// A method tool of a type that names only `'static`.
    #[tool(retry = "safe")]
    pub async fn greet(&self, n: u32) -> Result<String, NoError> {
        Ok(format!("{}{n}", self.0))
    }
}

/// Tools whose names stand inside a macro's input, in an `impl` and a `trait` of its own syntax.
macro_rules! tools {
    (impl $owner:ident { $(fn $name:ident;)* }) => {
        $(
            #[tool(retry = "safe")]
            pub async fn $name(x: u32) -> Result<u32, NoError> {
                Ok(x)
            }
        )*
    };
}

mod dsl {
    use super::*;

    tools! {
        impl Payments {
            fn lookup;
            fn refund_status;
        }
    }

    /// An indented free tool after it.
    #[tool(retry = "keyed")]
    pub async fn in_a_module(n: u32) -> Result<u32, NoError> {
        Ok(n)
    }
}

macro_rules! arm {
    (impl) => {
        #[tool(retry = "safe")]
        pub async fn from_an_arm(x: u32) -> Result<u32, NoError> {
            Ok(x)
        }
    };
}

mod arms {
    use super::*;

    arm!(impl);
}

#[tokio::main]
async fn main() {
    let run = Idem::in_memory().run("r");
    let desk = std::sync::Arc::new(Desk);
    assert_eq!(desk.measure(&run, 3).await.unwrap(), 3);
    let wrap = std::sync::Arc::new(Wrap(|s: &str| s.len()));
    assert_eq!(wrap.length(&run, "abc".into()).await.unwrap(), 3);
    let named = std::sync::Arc::new(Named("n"));
    assert_eq!(named.greet(&run, 1).await.unwrap(), "n1");
    assert_eq!(dsl::lookup(&run, 1).await.unwrap(), 1);
    assert_eq!(dsl::refund_status(&run, 2).await.unwrap(), 2);
    assert_eq!(dsl::in_a_module(&run, 4).await.unwrap(), 4);
    assert_eq!(arms::from_an_arm(&run, 5).await.unwrap(), 5);
}
