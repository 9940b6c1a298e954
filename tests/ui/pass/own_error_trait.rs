// A trait of the application's own named `Error`, boxed as a tool's error: serde's traits and
// `Classify` are implemented for it (allowed: `Box` is fundamental), so it is a valid tool error
// and the macro must not mistake it for `std::error::Error`.
use idem_core::{Classify, Failure, tool};

mod app {
    pub trait Error: std::fmt::Debug + std::fmt::Display + Send + Sync {
        fn message(&self) -> String;
    }

    #[derive(Debug)]
    pub struct Declined(pub String);

    impl std::fmt::Display for Declined {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl Error for Declined {
        fn message(&self) -> String {
            self.0.clone()
        }
    }

    impl serde::Serialize for dyn Error {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&self.message())
        }
    }

    impl<'de> serde::Deserialize<'de> for Box<dyn Error> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            Ok(Box::new(Declined(String::deserialize(d)?)))
        }
    }

    impl idem_core::Classify for Box<dyn Error> {
        fn classify(&self) -> idem_core::Failure {
            idem_core::Failure::permanent()
        }
    }
}

#[tool(retry = "keyed")]
async fn pay(amount: u32) -> Result<String, Box<dyn app::Error>> {
    if amount > 100 {
        return Err(Box::new(app::Declined(format!("declined {amount}"))));
    }
    Ok(format!("paid {amount}"))
}

async fn caller(run: &idem_core::Run) -> Result<String, idem_core::Error<Box<dyn app::Error>>> {
    pay(run, 5).await
}

fn main() {
    let _ = caller;
    let _: fn(&Box<dyn app::Error>) -> Failure = Classify::classify;
}
