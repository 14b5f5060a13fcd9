//! `zcnet`: zero-copy network I/O for Linux — find out what this host can do (`probe`) and
//! whether zero-copy pays on it (`bench`), move files (`send`/`recv`), measure the profile
//! the `auto` path chooses by (`tune`), and run unmodified programs over zcnet's transmit
//! paths (`run`).

#![forbid(unsafe_code)] // unsafe lives in the zcnet-sys crate only

mod bench;
mod library_opts;
mod manuals;
mod preload_lib;
mod probe;
mod probe_cmd;
mod run_board;
mod run_cmd;
mod transfer_cmd;
mod tune;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "zcnet",
    version,
    about = "Zero-copy network I/O for Linux: probe, measure, transfer files",
    after_help = "Environment (bench, send, recv, tune; the zcnet library itself reads none of these, \
the CLI asks it for each, see docs/guide.md \"What zcnet touches\"):\n  \
ZCNET_PROFILE=FILE              the profile `auto` reads (default: $XDG_CONFIG_HOME/zcnet/ or ~/.config/zcnet/)\n  \
ZCNET_PEER_CLOCK=off            no clock card in /dev/shm/zcnet-$EUID/ (on by default here)\n  \
ZCNET_TRIAL_MEMORY=off          a full receive trial on every connection\n  \
ZCNET_COW_BACKEND=userfaultfd|mprotect|none   the cow path's backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What this host supports, found by trying on real sockets.
    Probe {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure every transmit × receive path on loopback: throughput and CPU per GiB.
    Bench(Box<bench::Args>),
    /// Send files and directories (or stdin) to a `zcnet recv`.
    Send(transfer_cmd::SendArgs),
    /// Receive files into a directory, verified, never partial under their final name.
    Recv(transfer_cmd::RecvArgs),
    /// Measure every path's CPU per GiB here and write the profile the `auto` path reads.
    Tune(tune::Args),
    /// Run an unmodified program with zcnet's transmit paths (LD_PRELOAD), copy semantics kept.
    Run(run_cmd::Args),
    /// Man pages and shell completions from these definitions (for packagers).
    #[command(hide = true)]
    Manuals(manuals::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    library_opts::cow_backend();
    let result = match cli.command {
        Command::Probe { json } => probe_cmd::run(json),
        Command::Bench(args) => bench::run(&args),
        Command::Send(args) => transfer_cmd::send(&args),
        Command::Recv(args) => transfer_cmd::recv(&args),
        Command::Tune(args) => tune::run(&args),
        Command::Run(args) => run_cmd::run(&args),
        Command::Manuals(args) => manuals::run(&args, <Cli as clap::CommandFactory>::command()),
    };
    // A Ctrl-C during a netns run: its handler removes the namespaces and exits with 130.
    bench::yield_to_interrupt();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("zcnet: {msg}");
            ExitCode::FAILURE
        }
    }
}
