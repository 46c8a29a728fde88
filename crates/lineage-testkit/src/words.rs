//! Plausible filler text from a fixed vocabulary (ASCII only, so it embeds in JSON unescaped).

use crate::SplitMix64;

const WORDS: &[&str] = &[
    "the",
    "session",
    "log",
    "event",
    "turn",
    "step",
    "model",
    "tool",
    "result",
    "call",
    "agent",
    "parent",
    "child",
    "fork",
    "seed",
    "digest",
    "record",
    "block",
    "store",
    "append",
    "replay",
    "check",
    "valid",
    "balanced",
    "open",
    "closed",
    "prefix",
    "suffix",
    "policy",
    "sandbox",
    "file",
    "read",
    "write",
    "search",
    "test",
    "build",
    "error",
    "value",
    "index",
    "buffer",
    "stream",
    "chunk",
    "message",
    "user",
    "assistant",
    "request",
    "answer",
    "please",
    "explain",
    "why",
    "how",
    "this",
    "that",
    "function",
    "module",
    "crate",
    "struct",
    "field",
    "returns",
    "because",
    "and",
    "of",
    "to",
    "in",
    "is",
    "a",
    "with",
    "for",
    "on",
    "it",
    "we",
    "can",
    "should",
    "not",
    "when",
];

/// A space-separated run of words of at least `min_bytes` bytes (and not much more).
pub(crate) fn sentence(rng: &mut SplitMix64, min_bytes: usize) -> String {
    let mut out = String::with_capacity(min_bytes + 16);
    while out.len() < min_bytes {
        if !out.is_empty() {
            out.push(if rng.percent(8) { '.' } else { ' ' });
            if out.ends_with('.') {
                out.push(' ');
            }
        }
        out.push_str(word(rng));
    }
    out
}

/// One word of the vocabulary.
pub(crate) fn word(rng: &mut SplitMix64) -> &'static str {
    rng.pick(WORDS).copied().unwrap_or("word")
}

/// A stream delta of `min..=max` bytes, the way a model's tokens arrive: words and their spaces.
pub(crate) fn delta(rng: &mut SplitMix64, min: usize, max: usize) -> String {
    let target = rng.between(min as u64, max as u64) as usize;
    let mut out = String::new();
    while out.len() < target {
        out.push_str(word(rng));
        out.push(' ');
    }
    out.truncate(target.max(1));
    out
}
