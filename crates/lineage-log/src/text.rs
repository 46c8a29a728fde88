//! `Text`: the string type of decoded events.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// An immutable string that stores up to 24 bytes inline.
///
/// Most strings in a session log are short (stream deltas, names, codes), and replaying a large log
/// must not pay one heap allocation per string. The representation is private: use [`Text::as_str`]
/// or `Deref<Target = str>`, so it can change without breaking callers. On the wire it is a plain
/// postcard string.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Text(CompactString);

impl Text {
    /// The empty string.
    pub const fn empty() -> Self {
        Text(CompactString::const_new(""))
    }

    /// A `Text` from a static string, without allocating.
    pub const fn from_static(s: &'static str) -> Self {
        Text(CompactString::const_new(s))
    }

    /// The string itself.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.0.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.0.as_str()
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.0.as_str()
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Text(CompactString::from(s))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        Text(CompactString::from(s))
    }
}

impl From<&String> for Text {
    fn from(s: &String) -> Self {
        Text(CompactString::from(s.as_str()))
    }
}

impl From<Text> for String {
    fn from(t: Text) -> Self {
        t.0.into_string()
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_strings_round_trip_through_postcard() {
        for s in ["", "a", "twenty-four bytes exactly", &"x".repeat(1000)] {
            let t = Text::from(s);
            let bytes = postcard::to_allocvec(&t).unwrap();
            assert_eq!(
                bytes,
                postcard::to_allocvec(s).unwrap(),
                "wire form is a plain string"
            );
            let back: Text = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, s);
        }
    }
}
