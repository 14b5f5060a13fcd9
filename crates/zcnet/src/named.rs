//! One definition of the names the CLI, JSON and docs use for paths and modes, so `ALL`,
//! `name()`, `Display`, `FromStr` and the "known: …" list in its error cannot drift apart.

/// Implements `ALL`, `name()`, `Display` and `FromStr` for a fieldless enum from one list
/// of `Variant => "name"` pairs; `$what` names the kind in the parse error.
macro_rules! named_enum {
    ($ty:ident, $what:literal, { $($var:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every variant this build knows, in the order they are listed and run.
            pub const ALL: [$ty; [$(stringify!($var)),+].len()] = [$($ty::$var),+];

            /// The CLI/JSON name.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$var => $name,)+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = $crate::named::UnknownName;
            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                $ty::ALL.into_iter().find(|v| v.name() == s).ok_or_else(|| {
                    $crate::named::UnknownName {
                        what: $what,
                        name: s.to_string(),
                        known: $ty::ALL.iter().map(|v| v.name()).collect(),
                    }
                })
            }
        }
    };
}

pub(crate) use named_enum;

/// A name that is not one of a path's or mode's names (parsing `TxPath`, `RxPath`, …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?} (known: {})", known.join(", "))]
pub struct UnknownName {
    /// What was being parsed ("transmit path").
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// Every name that would have been accepted.
    pub known: Vec<&'static str>,
}

#[cfg(test)]
mod tests {
    use crate::{FileRxMode, FileTxMode, RxPath, TxPath};

    #[test]
    fn every_name_parses_back_and_the_error_lists_them_all() {
        for p in TxPath::ALL {
            assert_eq!(p.name().parse::<TxPath>(), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        for p in RxPath::ALL {
            assert_eq!(p.name().parse::<RxPath>(), Ok(p));
        }
        for m in FileTxMode::ALL {
            assert_eq!(m.name().parse::<FileTxMode>(), Ok(m));
        }
        for m in FileRxMode::ALL {
            assert_eq!(m.name().parse::<FileRxMode>(), Ok(m));
        }
        let e = "pigeon".parse::<TxPath>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown transmit path \"pigeon\" (known: copy, zerocopy, uring, cow, auto)"
        );
        assert_eq!(e.name, "pigeon");
        assert!("x"
            .parse::<FileTxMode>()
            .unwrap_err()
            .to_string()
            .ends_with("(known: sendfile, splice, read_send)"));
    }
}
