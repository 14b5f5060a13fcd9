//! One definition of a named counter set: the live struct of relaxed atomics, its `Serialize`
//! snapshot, and one adder per counter, all from one list, so a counter cannot be added to
//! one and forgotten in another (`zcnet::msg` uses it). Its `plain` form
//! makes a set of plain counters that its owner adds to as a delta and another stores as an
//! array of atomics (`zcnet::auto::AutoStats`, kept per direction in `Stats`).

/// `counter_set!(Live, Snapshot, "doc of Live" { /// doc \n field, ... })` defines
/// `Live` (`AtomicU64` per field, `Default`), `Snapshot` (`u64` per field, documented,
/// `Serialize`), `Live::snapshot()` and `Live::<field>(n)` adders (crate-visible). The caller's
/// module needs `serde::Serialize` and `std::sync::atomic::{AtomicU64, Ordering::Relaxed}` in
/// scope.
///
/// `counter_set!(#[attrs] plain Set { /// doc \n field, ... })` defines only `Set` (`u64` per
/// field, documented, with the caller's attributes: its doc and derives), `Set::LEN`, and
/// `Set::to_array()`/`Set::from_array()` in declaration order, for storage as
/// `[AtomicU64; Set::LEN]`.
macro_rules! counter_set {
    ($(#[$attr:meta])* plain $set:ident {
        $($(#[doc = $fdoc:literal])* $field:ident),* $(,)?
    }) => {
        $(#[$attr])*
        pub struct $set {
            $($(#[doc = $fdoc])* pub $field: u64,)*
        }

        impl $set {
            #[doc = concat!("How many counters there are ([`", stringify!($set), "::to_array`]).")]
            pub const LEN: usize = [$(stringify!($field)),*].len();

            /// The counters in declaration order, for atomic storage.
            pub fn to_array(&self) -> [u64; Self::LEN] {
                [$(self.$field),*]
            }

            #[doc = concat!("The inverse of [`", stringify!($set), "::to_array`].")]
            pub fn from_array(a: [u64; Self::LEN]) -> Self {
                let [$($field),*] = a;
                $set { $($field),* }
            }
        }
    };
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
