//! Strict JSON, for the payloads of `custom` events.
//!
//! A payload is kept as text and handed back byte for byte, so Lineage never needs to build a
//! value from it; it only checks that every reader will read the same value from it. That is
//! RFC 8259 JSON without the parts a reader cannot carry losslessly: `-0` (most JSON readers drop
//! the sign), numbers too large for a double (they read as infinity), and `\u` escapes of lone
//! surrogates (they are no Unicode text). `NaN` and `Infinity` are not JSON at all.
//!
//! The checker is iterative, so nesting depth costs heap, never stack.

/// Checks that `text` is one strict JSON value, optionally surrounded by whitespace. The error
/// says what is wrong and at which byte.
pub fn check_strict_json(text: &str) -> Result<(), String> {
    let mut p = Parser {
        bytes: text.as_bytes(),
        at: 0,
    };
    // The containers open around the current position: `{` or `[`.
    let mut open: Vec<u8> = Vec::new();
    p.whitespace();
    loop {
        // A value is expected here.
        match p.peek() {
            Some(b'{') => {
                p.at += 1;
                p.whitespace();
                if !p.eat(b'}') {
                    open.push(b'{');
                    p.key()?;
                    continue;
                }
            }
            Some(b'[') => {
                p.at += 1;
                p.whitespace();
                if !p.eat(b']') {
                    open.push(b'[');
                    continue;
                }
            }
            Some(b'"') => p.string()?,
            Some(b'-' | b'0'..=b'9') => p.number()?,
            Some(b't') => p.literal("true")?,
            Some(b'f') => p.literal("false")?,
            Some(b'n') => p.literal("null")?,
            Some(_) => return Err(p.unexpected("a value")),
            None => return Err(p.problem("the text ends where a value was expected")),
        }
        // After a value: close what it ends, or go on to the container's next member.
        loop {
            p.whitespace();
            match open.last() {
                None if p.at == p.bytes.len() => return Ok(()),
                None => return Err(p.problem("there is more after the value")),
                Some(b'{') => match p.next() {
                    Some(b',') => {
                        p.whitespace();
                        p.key()?;
                        break;
                    }
                    Some(b'}') => {
                        open.pop();
                    }
                    _ => return Err(p.back_problem("expected `,` or `}` after a member")),
                },
                Some(_) => match p.next() {
                    Some(b',') => {
                        p.whitespace();
                        break;
                    }
                    Some(b']') => {
                        open.pop();
                    }
                    _ => return Err(p.back_problem("expected `,` or `]` after an element")),
                },
            }
        }
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.at += 1;
        }
        found
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn problem(&self, what: &str) -> String {
        format!("{what} (at byte {})", self.at)
    }

    /// A problem with the byte just consumed.
    fn back_problem(&mut self, what: &str) -> String {
        self.at = self.at.saturating_sub(1);
        self.problem(what)
    }

    fn unexpected(&self, expected: &str) -> String {
        let rest = &self.bytes[self.at..];
        for word in ["NaN", "Infinity", "-Infinity"] {
            if rest.starts_with(word.as_bytes()) {
                return self.problem(&format!("{word} is not a JSON number"));
            }
        }
        let found = String::from_utf8_lossy(&rest[..rest.len().min(8)]).into_owned();
        self.problem(&format!("expected {expected}, found {found:?}"))
    }

    fn literal(&mut self, word: &str) -> Result<(), String> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(())
        } else {
            Err(self.unexpected("a value"))
        }
    }

    /// An object's key and its colon, leaving the position at the member's value.
    fn key(&mut self) -> Result<(), String> {
        if self.peek() != Some(b'"') {
            return Err(self.unexpected("a string key"));
        }
        self.string()?;
        self.whitespace();
        if !self.eat(b':') {
            return Err(self.unexpected("`:` after a key"));
        }
        self.whitespace();
        Ok(())
    }

    fn string(&mut self) -> Result<(), String> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.next() {
                None => {
                    self.at = start;
                    return Err(self.problem("a string is not closed"));
                }
                Some(b'"') => return Ok(()),
                Some(b'\\') => self.escape()?,
                Some(byte) if byte < 0x20 => {
                    return Err(
                        self.back_problem("a control character must be escaped in a string")
                    );
                }
                Some(_) => {}
            }
        }
    }

    /// The escape after a backslash. A `\u` escape of a high surrogate must be followed by one
    /// of a low surrogate, and a low surrogate may not stand alone.
    fn escape(&mut self) -> Result<(), String> {
        match self.next() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(()),
            Some(b'u') => {
                let unit = self.hex4()?;
                if (0xDC00..0xE000).contains(&unit) {
                    return Err(self.problem("a \\u escape is a lone low surrogate"));
                }
                if (0xD800..0xDC00).contains(&unit) {
                    let low = if self.bytes[self.at..].starts_with(b"\\u") {
                        self.at += 2;
                        self.hex4()?
                    } else {
                        0
                    };
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(self.problem("a \\u escape is a lone high surrogate"));
                    }
                }
                Ok(())
            }
            _ => Err(self.back_problem("not a JSON escape")),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.bytes.get(self.at..self.at + 4);
        let unit = digits
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.problem("a \\u escape needs four hex digits"))?;
        self.at += 4;
        Ok(unit)
    }

    fn number(&mut self) -> Result<(), String> {
        let start = self.at;
        let negative = self.eat(b'-');
        let mut all_zero = true;
        match self.next() {
            Some(b'0') => {}
            Some(b'1'..=b'9') => {
                all_zero = false;
                self.digits();
            }
            _ => {
                self.at = start;
                return Err(self.unexpected("a number"));
            }
        }
        if self.peek().is_some_and(|b| b.is_ascii_digit()) {
            return Err(self.problem("a number may not have a leading zero"));
        }
        if self.eat(b'.') {
            let fraction = self.at;
            if self.digits() == 0 {
                return Err(self.problem("a fraction needs a digit after `.`"));
            }
            all_zero &= self.bytes[fraction..self.at].iter().all(|&b| b == b'0');
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.problem("an exponent needs a digit"));
            }
        }
        let text = std::str::from_utf8(&self.bytes[start..self.at]).expect("ASCII");
        if negative && all_zero {
            self.at = start;
            return Err(self.problem(&format!(
                "{text} is negative zero, which JSON readers do not keep"
            )));
        }
        if text.parse::<f64>().is_ok_and(f64::is_infinite) {
            self.at = start;
            return Err(self.problem(&format!("{text} is too large for a double")));
        }
        Ok(())
    }

    /// Skips ASCII digits; returns how many.
    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        self.at - start
    }
}

#[cfg(test)]
mod tests {
    use super::check_strict_json;

    #[test]
    fn json_values_pass() {
        for ok in [
            "{}",
            "[]",
            " \t\n{\"a\": [1, -2.5e3, 0, 0.0, -0.5, 1E+2, true, false, null, \"x\\n\\u00e9\"]}\r\n",
            "\"\\ud83d\\ude00\"",
            "-1",
            "0e0",
            "1.7976931348623157e308",
            "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]",
            "{\"\":{\"\":{}}}",
            "\"é\"",
        ] {
            assert_eq!(check_strict_json(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn what_json_cannot_carry_is_named() {
        for (bad, named) in [
            ("NaN", "NaN is not a JSON number (at byte 0)"),
            ("[1, Infinity]", "Infinity is not a JSON number (at byte 4)"),
            (
                "{\"x\": -Infinity}",
                "-Infinity is not a JSON number (at byte 6)",
            ),
            ("-0", "-0 is negative zero"),
            ("[-0.000e5]", "-0.000e5 is negative zero"),
            ("1e400", "1e400 is too large for a double"),
            ("\"\\ud800\"", "lone high surrogate"),
            ("\"\\udc00\"", "lone low surrogate"),
            ("\"\\ud800\\u0041\"", "lone high surrogate"),
        ] {
            let problem = check_strict_json(bad).unwrap_err();
            assert!(problem.contains(named), "{bad:?}: {problem}");
        }
    }

    #[test]
    fn what_is_not_json_is_refused_with_its_place() {
        for (bad, at) in [
            ("", 0),
            ("   ", 3),
            ("{} {}", 3),
            ("{", 1),
            ("[1,]", 3),
            ("[1 2]", 3),
            ("{\"a\" 1}", 5),
            ("{\"a\":1,}", 7),
            ("{1:2}", 1),
            ("01", 1),
            ("1.", 2),
            ("1e", 2),
            ("-", 0),
            ("+1", 0),
            ("\"abc", 0),
            ("\"a\tb\"", 2),
            ("\"\\x\"", 2),
            ("\"\\u12\"", 3),
            ("tru", 0),
            ("nul", 0),
            ("'a'", 0),
        ] {
            let problem = check_strict_json(bad).unwrap_err();
            assert!(
                problem.ends_with(&format!("(at byte {at})")),
                "{bad:?}: {problem}"
            );
        }
    }

    #[test]
    fn deep_nesting_costs_no_stack() {
        let deep = format!("{}{}", "[".repeat(1_000_000), "]".repeat(1_000_000));
        assert_eq!(check_strict_json(&deep), Ok(()));
        assert!(check_strict_json(&"[".repeat(1_000_000)).is_err());
    }
}
