//! `outbox`: the operator's command for a transactional outbox on PostgreSQL, MySQL/MariaDB or
//! SQLite. Runs the outbox migrations, shows stats, pending messages and dead letters, and
//! re-queues or purges dead letters. `outbox --help` tells the rest.

#![forbid(unsafe_code)]
#![warn(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod cli;
mod commands;
mod db;
mod error;
mod format;
mod table;

use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use crate::cli::Cli;
use crate::commands::Output;
use crate::error::CliError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(url) = cli.database_url.as_deref() else {
        Cli::command()
            .error(
                ErrorKind::MissingRequiredArgument,
                "no database: pass --database-url URL or set DATABASE_URL",
            )
            .exit();
    };
    match db::run(url, &cli.command, cli.json).and_then(print) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", table::one_line(&error.to_string()));
            ExitCode::FAILURE
        }
    }
}

/// Writes the output; a reader that went away (`outbox dead list | head`) is no error.
fn print(output: Output) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(output.stdout.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    output.error.map_or(Ok(()), Err)
}
