//! The writer's report lines: what it is about to do and what the store acknowledged.
//!
//! The writer prints one line per step, flushed before it goes on, so that every line the parent
//! reads after a kill was printed before the kill. Events are described by the blake3 digest of
//! their framed record (the bytes the store keeps), so the parent can compare them byte for byte
//! with what it reads back without holding the events themselves.
//!
//! ```text
//! phase <creating|opening|opened|flush|done>
//! create <session>                          a new top-level session is registered
//! append <session> <first seq> <digests>    events about to be appended (admitted, then flushed)
//! admit <session> <first seq> <digests>     events about to be admitted for a later commit
//! repair <session> <first seq> <digests>    the closers a load with repair is about to write
//! durable <session> <seq>                   every event of the session up to seq is durable
//! fork-start <child> <parent> <boundary|whole> <time>   a fork is about to be written
//! fork <child> <parent> <seed len> <seed digest>        the fork is durable
//! error <what>                              the writer met an error and stops
//! ```
//!
//! `<digests>` is a comma-separated list of 64-digit hex digests, or `-` for none.

use std::fmt;

use lineage_log::{Chain, Digest, Event, SessionId, encode_record};

/// What the writer is doing, announced as it starts doing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// About to create the store file (none exists).
    Creating,
    /// About to open an existing store file.
    Opening,
    /// The store is open; nothing was written yet.
    Opened,
    /// About to wait for a flush of admitted batches.
    Flush,
    /// The writer did all it was asked and waits to be killed.
    Done,
}

impl Phase {
    const ALL: [(Phase, &'static str); 5] = [
        (Phase::Creating, "creating"),
        (Phase::Opening, "opening"),
        (Phase::Opened, "opened"),
        (Phase::Flush, "flush"),
        (Phase::Done, "done"),
    ];

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(p, _)| *p == self)
            .map_or("?", |(_, n)| n)
    }

    fn parse(word: &str) -> Option<Phase> {
        Self::ALL.iter().find(|(_, n)| *n == word).map(|(p, _)| *p)
    }
}

/// How a batch of described events reaches the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Write {
    /// Admitted and flushed at once.
    Append,
    /// Admitted only; a later flush (or the commit window) makes it durable.
    Admit,
    /// Crash-repair closers, written by a load.
    Repair,
}

impl Write {
    /// The line's first word, also the store call's name.
    pub fn word(self) -> &'static str {
        match self {
            Write::Append => "append",
            Write::Admit => "admit",
            Write::Repair => "repair",
        }
    }
}

/// One report line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The writer enters a phase.
    Phase(Phase),
    /// A new top-level session is registered (it is stored with its first durable batch).
    Create(SessionId),
    /// Events about to be written to `session`, from `first` on.
    Events {
        /// How they are written.
        write: Write,
        /// The session.
        session: SessionId,
        /// The seq of the first.
        first: u64,
        /// The digest of each event's record, in seq order.
        digests: Vec<Digest>,
    },
    /// Every event of `session` up to `through` is durable.
    Durable {
        /// The session.
        session: SessionId,
        /// The last durable seq.
        through: u64,
    },
    /// A fork is about to be written.
    ForkStart {
        /// The new session.
        child: SessionId,
        /// The session forked.
        parent: SessionId,
        /// The inclusive boundary, or `None` for the whole parent.
        boundary: Option<u64>,
        /// The child's creation time (also its `session/lineage` time).
        time_ms: u64,
    },
    /// A fork is durable.
    Fork {
        /// The new session.
        child: SessionId,
        /// The session forked.
        parent: SessionId,
        /// How many events the child inherited.
        seed_len: u64,
        /// The parent's running digest at `seed_len - 1`, as the child's header has it.
        seed_digest: Digest,
    },
    /// The writer failed and stops.
    Error(String),
}

/// The digest by which a report describes one event: blake3 of its framed record.
pub fn record_digest(event: &Event) -> Digest {
    digest_of_record(&encode_record(event))
}

/// Blake3 of one framed record.
pub fn digest_of_record(record: &[u8]) -> Digest {
    let mut chain = Chain::new();
    chain.update(record);
    chain.digest()
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Phase(phase) => write!(f, "phase {}", phase.name()),
            Report::Create(session) => write!(f, "create {session}"),
            Report::Events {
                write,
                session,
                first,
                digests,
            } => {
                write!(f, "{} {session} {first} ", write.word())?;
                if digests.is_empty() {
                    return f.write_str("-");
                }
                for (i, digest) in digests.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{digest}")?;
                }
                Ok(())
            }
            Report::Durable { session, through } => write!(f, "durable {session} {through}"),
            Report::ForkStart {
                child,
                parent,
                boundary,
                time_ms,
            } => match boundary {
                Some(b) => write!(f, "fork-start {child} {parent} {b} {time_ms}"),
                None => write!(f, "fork-start {child} {parent} whole {time_ms}"),
            },
            Report::Fork {
                child,
                parent,
                seed_len,
                seed_digest,
            } => write!(f, "fork {child} {parent} {seed_len} {seed_digest}"),
            // One line: the message's own line breaks become spaces.
            Report::Error(what) => write!(f, "error {}", what.replace(['\n', '\r'], " ")),
        }
    }
}

/// Parses one report line (without its line break), saying which word is wrong.
pub fn parse(line: &str) -> Result<Report, String> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    if word == "error" {
        return Ok(Report::Error(rest.to_owned()));
    }
    let args: Vec<&str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split(' ').collect()
    };
    let want = |n: usize| {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!(
                "`{word}` takes {n} argument(s), the line has {}",
                args.len()
            ))
        }
    };
    let events = |write: Write| -> Result<Report, String> {
        want(3)?;
        let digests = if args[2] == "-" {
            Vec::new()
        } else {
            args[2]
                .split(',')
                .map(parse_digest)
                .collect::<Result<_, _>>()?
        };
        Ok(Report::Events {
            write,
            session: session(args[0])?,
            first: number(args[1])?,
            digests,
        })
    };
    match word {
        "phase" => {
            want(1)?;
            Phase::parse(args[0])
                .map(Report::Phase)
                .ok_or_else(|| format!("unknown phase {:?}", args[0]))
        }
        "create" => {
            want(1)?;
            Ok(Report::Create(session(args[0])?))
        }
        "append" => events(Write::Append),
        "admit" => events(Write::Admit),
        "repair" => events(Write::Repair),
        "durable" => {
            want(2)?;
            Ok(Report::Durable {
                session: session(args[0])?,
                through: number(args[1])?,
            })
        }
        "fork-start" | "fork" => {
            want(4)?;
            let (child, parent) = (session(args[0])?, session(args[1])?);
            Ok(if word == "fork" {
                Report::Fork {
                    child,
                    parent,
                    seed_len: number(args[2])?,
                    seed_digest: parse_digest(args[3])?,
                }
            } else {
                Report::ForkStart {
                    child,
                    parent,
                    boundary: match args[2] {
                        "whole" => None,
                        b => Some(number(b)?),
                    },
                    time_ms: number(args[3])?,
                }
            })
        }
        other => Err(format!("unknown report {other:?}")),
    }
}

fn session(word: &str) -> Result<SessionId, String> {
    word.parse()
        .map_err(|e| format!("{word:?} is not a session id: {e}"))
}

fn number(word: &str) -> Result<u64, String> {
    word.parse()
        .map_err(|_| format!("{word:?} is not a number"))
}

/// Parses 64 hex digits.
pub fn parse_digest(word: &str) -> Result<Digest, String> {
    let bytes = word.as_bytes();
    if bytes.len() != 64 {
        return Err(format!(
            "a digest has 64 hex digits, {word:?} has {}",
            bytes.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        match (digit(pair[0]), digit(pair[1])) {
            (Some(hi), Some(lo)) => out[i] = hi << 4 | lo,
            _ => return Err(format!("{word:?} is not hex")),
        }
    }
    Ok(Digest(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(byte: u8) -> Digest {
        Digest([byte; 32])
    }

    #[test]
    fn every_report_reads_back_as_printed() {
        let (a, b) = (SessionId::new(), SessionId::new());
        let reports = [
            Report::Phase(Phase::Creating),
            Report::Phase(Phase::Opening),
            Report::Phase(Phase::Opened),
            Report::Phase(Phase::Flush),
            Report::Phase(Phase::Done),
            Report::Create(a),
            Report::Events {
                write: Write::Append,
                session: a,
                first: 7,
                digests: vec![digest(1), digest(0xab)],
            },
            Report::Events {
                write: Write::Admit,
                session: a,
                first: 9,
                digests: vec![digest(2)],
            },
            Report::Events {
                write: Write::Repair,
                session: b,
                first: 40,
                digests: Vec::new(),
            },
            Report::Durable {
                session: a,
                through: 9,
            },
            Report::ForkStart {
                child: b,
                parent: a,
                boundary: Some(5),
                time_ms: 1_750_000_000_123,
            },
            Report::ForkStart {
                child: b,
                parent: a,
                boundary: None,
                time_ms: 3,
            },
            Report::Fork {
                child: b,
                parent: a,
                seed_len: 6,
                seed_digest: digest(0x5c),
            },
            Report::Error("append to session x: refused".into()),
        ];
        for report in reports {
            let line = report.to_string();
            assert!(!line.contains('\n'), "{line:?} is one line");
            assert_eq!(parse(&line), Ok(report), "{line}");
        }
        assert_eq!(
            parse(&Report::Error("two\nlines".into()).to_string()),
            Ok(Report::Error("two lines".into()))
        );
    }

    #[test]
    fn a_torn_or_foreign_line_is_refused_with_the_word_at_fault() {
        let a = SessionId::new();
        let full = Report::Events {
            write: Write::Append,
            session: a,
            first: 0,
            digests: vec![digest(3), digest(4)],
        }
        .to_string();
        // A line cut inside a digest, as a kill in the middle of a write leaves it.
        let torn = &full[..full.len() - 10];
        assert!(parse(torn).unwrap_err().contains("64 hex digits"));
        assert!(
            parse("durable nope 3")
                .unwrap_err()
                .contains("not a session id")
        );
        assert!(
            parse(&format!("durable {a}"))
                .unwrap_err()
                .contains("takes 2")
        );
        assert!(
            parse(&format!("durable {a} x"))
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            parse("phase sleeping")
                .unwrap_err()
                .contains("unknown phase")
        );
        assert!(parse("hello").unwrap_err().contains("unknown report"));
        assert!(
            parse(&format!("append {a} 0 {}", "g".repeat(64)))
                .unwrap_err()
                .contains("not hex")
        );
    }
}
