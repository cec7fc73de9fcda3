//! The `octofs` command line: parses arguments, validates names before anything is touched, and
//! speaks to the daemon (starting one when none runs). Results go to stdout; errors are one line on
//! stderr with a non-zero exit. The commands are in `cli` (one module per group); this is the
//! entry: parse, resolve the layout, dispatch, exit.

#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use cli::args::{Cli, Cmd};
use octofs::layout::Layout;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::TransportAs(a) = cli.cmd {
        return cli::admin::transport_as(a);
    }
    if !cli.cmd.is_service() {
        octofs::sys::default_sigpipe();
    }
    let from_env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let layout = Layout::resolve(
        cli.state.or_else(|| from_env("OCTOFS_STATE")),
        cli.root.or_else(|| from_env("OCTOFS_ROOT")),
    );
    match cli::run(&layout, cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("octofs: {e}");
            if cli::interrupted() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
