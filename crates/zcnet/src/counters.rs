//! One definition of a set of plain counters that its owner adds to as a delta and another
//! stores as an array of atomics (`zcnet::auto::AutoStats`, kept per direction in `Stats`):
//! the struct, its length and the conversions to and from the array come from one list, so
//! a counter cannot be added to one and forgotten in another.

/// `counter_set!(#[attrs] plain Set { /// doc \n field, ... })` defines `Set` (`u64` per
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
}

pub(crate) use counter_set;
