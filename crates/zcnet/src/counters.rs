//! One definition of a named counter set: the live struct of relaxed atomics, its `Serialize`
//! snapshot, and one adder per counter, all from one list, so a counter cannot be added to
//! one and forgotten in another (`zcnet::msg` and `zcnet::lm` both use it).

/// `counter_set!(Live, Snapshot, "doc of Live" { /// doc \n field, ... })` defines
/// `Live` (`AtomicU64` per field, `Default`), `Snapshot` (`u64` per field, documented,
/// `Serialize`), `Live::snapshot()` and `Live::<field>(n)` adders (crate-visible). The caller's
/// module needs `serde::Serialize` and `std::sync::atomic::{AtomicU64, Ordering::Relaxed}` in
/// scope.
macro_rules! counter_set {
    ($live:ident, $snap:ident, $doc:literal {
        $($(#[doc = $fdoc:literal])* $field:ident),* $(,)?
    }) => {
        #[doc = $doc]
        #[derive(Debug, Default)]
        pub struct $live {
            $($field: AtomicU64,)*
        }

        #[doc = concat!("A point-in-time copy of [`", stringify!($live), "`].")]
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        #[non_exhaustive]
        pub struct $snap {
            $($(#[doc = $fdoc])* pub $field: u64,)*
        }

        impl $live {
            /// Reads every counter.
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $($field: self.$field.load(Relaxed),)*
                }
            }
        }

        /// Adders, one per counter (an `add(field, n)` would lose the names).
        #[allow(missing_docs, dead_code)]
        impl $live {
            $(pub(crate) fn $field(&self, n: u64) { self.$field.fetch_add(n, Relaxed); })*
        }
    };
}

pub(crate) use counter_set;
