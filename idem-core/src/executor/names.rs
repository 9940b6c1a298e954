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

/// Where a tool is declared: [`Tool::declared_at`](crate::Tool::declared_at) and, for a method,
/// [`Tool::declared_on`](crate::Tool::declared_on).
pub(crate) type Declared = (&'static str, &'static str);

/// A declaration as the operator reads it: `app::find`, and for a method `, a
/// method of app::Alpha`.
pub(crate) fn shown((at, on): Declared) -> String {
    if on.is_empty() { at.to_owned() } else { format!("{at}, a method of {on}") }
}

/// The declarations called under each name, in one `Idem`.
pub(crate) struct Names {
    /// Tells this table apart from any other, for the per-thread memo (an address could be
    /// reused by a table made after this one is dropped).
    id: u64,
    held: RwLock<HashMap<&'static str, Declared, foldhash::fast::RandomState>>,
}

thread_local! {
    /// The last (table, definition, declaration) this thread found holding its name: calls of one
    /// tool in a row compare six words instead of taking the table's lock.
    static LAST: Cell<(u64, usize, usize, usize, usize, usize)> =
        const { Cell::new((0, 0, 0, 0, 0, 0)) };
}

impl Names {
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Names { id: NEXT.fetch_add(1, Ordering::Relaxed), held: RwLock::default() }
    }

    /// `Ok` when the declaration `(at, on)` holds `def.name`, or does now; otherwise the one that
    /// holds it. A tool implemented by hand or given its name (`at` empty) is not checked.
    #[inline]
    pub(crate) fn check(&self, def: &'static ToolDef, declared: Declared) -> Result<(), Declared> {
        let (at, on) = declared;
        if at.is_empty() {
            return Ok(());
        }
        // A definition at one address has one name: the memo stands for (name, at, on).
        let this = (
            self.id,
            def as *const ToolDef as usize,
            at.as_ptr() as usize,
            at.len(),
            on.as_ptr() as usize,
            on.len(),
        );
        if LAST.with(Cell::get) == this {
            return Ok(());
        }
        self.held_by(def.name, declared)?;
        LAST.with(|last| last.set(this));
        Ok(())
    }

    fn held_by(&self, name: &'static str, declared: Declared) -> Result<(), Declared> {
        let read = self.held.read().unwrap_or_else(PoisonError::into_inner).get(name).copied();
        let holder = match read {
            Some(holder) => holder,
            None => {
                let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
                *held.entry(name).or_insert(declared)
            }
        };
        if holder == declared { Ok(()) } else { Err(holder) }
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
        let users_get = ("app::users::get", "");
        let orders_get = ("app::orders::get", "");
        assert_eq!(names.check(users, users_get), Ok(()));
        // Again, from the memo and from the table (another definition of the same tool).
        assert_eq!(names.check(users, users_get), Ok(()));
        assert_eq!(names.check(def("get"), users_get), Ok(()));
        assert_eq!(names.check(orders, orders_get), Err(users_get));
        // Refused every time, not only the first.
        assert!(names.check(orders, orders_get).is_err());
        // One method declaration on two types (a generic block, a block a macro wrote twice).
        let a = ("app::find", "app::A");
        let b = ("app::find", "app::B");
        assert_eq!(names.check(def("find"), a), Ok(()));
        assert_eq!(names.check(def("find"), b), Err(a));
        assert_eq!(shown(b), "app::find, a method of app::B");
        // Hand-written tools are not checked; another table knows nothing of this one.
        assert_eq!(names.check(orders, ("", "")), Ok(()));
        assert_eq!(Names::new().check(orders, orders_get), Ok(()));
    }
}
