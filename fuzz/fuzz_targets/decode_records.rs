//! Any bytes, read as back-to-back records: decoding never panics, and every record that decodes
//! re-encodes to a record that decodes to the same event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lineage_log::{Records, decode_record, encode_record, split_record};

fuzz_target!(|data: &[u8]| {
    for item in Records::new(data, 0) {
        let Ok((seq, raw)) = item else { break };
        let Ok(event) = decode_record(seq, &raw) else {
            continue;
        };
        let again = encode_record(&event);
        let (raw_again, rest) = split_record(&again, seq).expect("an encoded record splits");
        assert!(rest.is_empty());
        assert_eq!(
            decode_record(seq, &raw_again).expect("an encoded record decodes"),
            event
        );
    }
});
