//! What tools that measure a host and write its profile need from `auto`'s machinery.
//!
//! Why a module of its own: an application never needs these. It picks
//! [`TxPath::Auto`](crate::TxPath::Auto) / [`RxPath::Auto`](crate::RxPath::Auto), names a
//! profile with [`ProfileSource`](crate::auto::ProfileSource) and reads what was decided in
//! [`AutoStats`](crate::auto::AutoStats). `zcnet tune` (which measures paths and writes the
//! profile), `zcnet bench` and zcnet-bench (which build profile tables from bench runs and
//! compare `auto` with the best pair) and zcnet-tokio (which runs the same run-time cost check
//! on its own streams) need the parts below; keeping them here, rather than making `auto`'s
//! modules public, leaves `auto` free to change inside.
//!
//! * The profile's contents: [`Profile`], its tables ([`Measurement`], [`PairMeasurement`],
//!   [`PathPair`], [`FilePair`], [`Spread`]), what it is keyed by ([`HostKey`],
//!   [`host_key_for`], [`Topology`]) and how it is written ([`write_atomically`], [`SCHEMA`],
//!   [`Created`]).
//! * Loading one as a connection would: [`load`] → [`Loaded`].
//! * The choice a profile leads to: [`Chooser`] (what `auto` takes per size), [`pair_chooser`]
//!   (the same over measured pairs), [`aimed`] (the pair an `auto → auto` connection aims at), [`file_chooser`] (`send_file`'s mode).
//! * The run-time check: [`CostCheck`], its [`Pick`] and [`Verdict`], and the bytes each of
//!   its windows measures ([`WINDOW_BYTES`]).
//! * [`median`], the statistic the receive trial and the bench reports rest on, and
//!   [`AutoPath`], what transmit and receive paths share.

pub use crate::auto::choose::{Choice, ChoiceReason, Chooser, Crossover};
pub use crate::auto::cost::{CostCheck, Pick, Verdict, WINDOW_BYTES};
pub use crate::auto::file::chooser as file_chooser;
pub use crate::auto::median;
pub use crate::auto::pair::{aimed, chooser as pair_chooser};
pub use crate::profile::load::{host_key_for, load, HostKeyError, Loaded};
pub use crate::profile::{
    write_atomically, AutoPath, Created, FilePair, HostKey, Measurement, PairMeasurement, PathPair,
    Profile, ProfileError, Spread, Topology, SCHEMA,
};
