//! One tool per stable name in an [`Idem`](super::Idem). The name is part of every key, so two
//! tools declared under one name (`users::get` and `orders::get`, both `get`) would share keys:
//! the second one called would be answered with the first one's stored results, silently. A
//! `ToolSet` refuses two tools of one name; calls made outside a set are checked here: the first
//! declaration called under a name holds it, and a call of another is refused.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use crate::tool::ToolDef;

/// The declarations called under each name, in one `Idem`.
pub(crate) struct Names {
    /// Tells this table apart from any other, for the per-thread memo (an address could be
    /// reused by a table made after this one is dropped).
    id: u64,
    held: RwLock<HashMap<&'static str, &'static str, foldhash::fast::RandomState>>,
}

thread_local! {
    /// The last (table, definition, declaration) this thread found holding its name: calls of one
    /// tool in a row compare four words instead of taking the table's lock.
    static LAST: Cell<(u64, usize, usize, usize)> = const { Cell::new((0, 0, 0, 0)) };
}

impl Names {
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Names { id: NEXT.fetch_add(1, Ordering::Relaxed), held: RwLock::default() }
    }

    /// `Ok` when `at` (a [`Tool::declared_at`](crate::Tool::declared_at)) holds `def.name`, or
    /// does now; otherwise the declaration that holds it. A tool implemented by hand (`at`
    /// empty) is not checked.
    #[inline]
    pub(crate) fn check(
        &self,
        def: &'static ToolDef,
        at: &'static str,
    ) -> Result<(), &'static str> {
        if at.is_empty() {
            return Ok(());
        }
        // A definition at one address has one name: the memo stands for the (name, at) pair.
        let this = (self.id, def as *const ToolDef as usize, at.as_ptr() as usize, at.len());
        if LAST.with(Cell::get) == this {
            return Ok(());
        }
        self.held_by(def.name, at)?;
        LAST.with(|last| last.set(this));
        Ok(())
    }

    fn held_by(&self, name: &'static str, at: &'static str) -> Result<(), &'static str> {
        let read = self.held.read().unwrap_or_else(PoisonError::into_inner).get(name).copied();
        let holder = match read {
            Some(holder) => holder,
            None => {
                let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
                *held.entry(name).or_insert(at)
            }
        };
        if holder == at { Ok(()) } else { Err(holder) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetryClass;
    use crate::policy::ToolOptions;

    fn def(name: &'static str) -> &'static ToolDef {
        Box::leak(Box::new(ToolDef {
            name,
            description: "",
            class: RetryClass::Keyed,
            options: ToolOptions::NONE,
        }))
    }

    #[test]
    fn the_first_declaration_called_under_a_name_holds_it() {
        let names = Names::new();
        let (users, orders) = (def("get"), def("get"));
        assert_eq!(names.check(users, "app::users::get (src/users.rs:3)"), Ok(()));
        // Again, from the memo and from the table (another definition of the same tool).
        assert_eq!(names.check(users, "app::users::get (src/users.rs:3)"), Ok(()));
        assert_eq!(names.check(def("get"), "app::users::get (src/users.rs:3)"), Ok(()));
        assert_eq!(
            names.check(orders, "app::orders::get (src/orders.rs:9)"),
            Err("app::users::get (src/users.rs:3)")
        );
        // Refused every time, not only the first.
        assert!(names.check(orders, "app::orders::get (src/orders.rs:9)").is_err());
        // Hand-written tools are not checked; another table knows nothing of this one.
        assert_eq!(names.check(orders, ""), Ok(()));
        assert_eq!(Names::new().check(orders, "app::orders::get (src/orders.rs:9)"), Ok(()));
    }
}
