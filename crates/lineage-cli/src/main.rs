//! `lineage`: inspect Lineage session stores, offline or while a host is writing them. The
//! commands live in the library ([`lineage_cli::run`]); this is the process around them.

#![forbid(unsafe_code)]

use std::io;
use std::process::ExitCode;

fn main() -> ExitCode {
    let code = lineage_cli::run(
        std::env::args_os(),
        &mut io::stdout().lock(),
        &mut io::stderr(),
    );
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
