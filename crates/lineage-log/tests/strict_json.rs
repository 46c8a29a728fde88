//! The strict-JSON check of `custom` payloads agrees with a reference JSON reader: whatever it
//! accepts, the reader reads; whatever the reader reads, it accepts, except `-0`, which it refuses
//! on purpose because most readers drop the sign.

use lineage_log::check_strict_json;
use proptest::prelude::*;

/// Text near JSON: its punctuation, digits, escapes and the first letters of its literals.
fn near_json() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r#"[\[\]{}:," 0-9.eE+\-tfnrulsaNI\\/ud8c]{0,24}"#).unwrap()
}

/// JSON a writer produced, then possibly cut or spliced.
fn written_json() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| serde_json::json!(f)),
        ".{0,6}".prop_map(serde_json::Value::String),
    ];
    let value = leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(".{0,4}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    (value, any::<usize>(), any::<bool>()).prop_map(|(value, cut, cutting)| {
        let text = value.to_string();
        if cutting && !text.is_empty() {
            let mut at = cut % text.len();
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text[..at].to_owned()
        } else {
            text
        }
    })
}

fn agrees(text: &str) -> Result<(), TestCaseError> {
    let ours = check_strict_json(text);
    let reference = serde_json::from_str::<serde_json::Value>(text);
    match (&ours, &reference) {
        (Ok(()), Ok(_)) | (Err(_), Err(_)) => Ok(()),
        (Ok(()), Err(e)) => Err(TestCaseError::fail(format!(
            "{text:?} passed, but the reference reader refuses it: {e}"
        ))),
        (Err(problem), Ok(_)) if problem.contains("negative zero") => Ok(()),
        (Err(problem), Ok(_)) => Err(TestCaseError::fail(format!(
            "{text:?} was refused ({problem}), but the reference reader reads it"
        ))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn text_near_json_is_judged_as_a_json_reader_judges_it(text in near_json()) {
        agrees(&text)?;
    }

    #[test]
    fn written_json_passes_and_cut_json_is_judged_as_a_json_reader_judges_it(text in written_json()) {
        agrees(&text)?;
    }
}
