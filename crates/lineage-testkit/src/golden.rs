//! What the golden vector files of the formats share: whether this run rewrites them, and bytes
//! written as hex and read back.

use std::fmt::Write;

/// Whether this run rewrites the vector files instead of comparing with them
/// (`LINEAGE_BLESS=1`).
pub fn blessing() -> bool {
    std::env::var("LINEAGE_BLESS").is_ok_and(|v| v == "1")
}

/// `bytes` as lowercase hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        write!(out, "{byte:02x}").expect("writing to a String cannot fail");
    }
    out
}

/// The bytes hex string `s` (on line `line` of `file`) stands for. Panics, naming the place,
/// if it is not an even-length string of hex digits.
pub fn unhex(file: &str, line: usize, s: &str) -> Vec<u8> {
    assert!(
        s.len().is_multiple_of(2) && s.bytes().all(|c| c.is_ascii_hexdigit()),
        "{file}:{line}: not an even-length hex string: {s:?}"
    );
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("checked hex digits"))
        .collect()
}
