//! `lineage`: inspect Lineage session stores, offline or while a host is writing them. The
//! commands live in the library ([`lineage_cli::run`]); this is the process around them.

#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    lineage_cli::quiet_engine_panics();
    let ran = std::panic::catch_unwind(|| {
        lineage_cli::run(
            std::env::args_os(),
            // Not locked for the whole run: `acp serve` writes frames to stdout from another thread.
            &mut io::stdout(),
            &mut io::stderr(),
        )
    });
    match ran {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        // A panic the store did not contain is a bug, and the engine's own may have been silent.
        Err(_) => {
            let _ = writeln!(
                io::stderr(),
                "lineage: internal error: the command stopped on a panic; please report it"
            );
            ExitCode::from(101)
        }
    }
}
