//! Any bytes, as a model endpoint's answer in each wire format, delivered in any chunking:
//! reading never panics, and what it yields keeps the adapters' promises: every chunk before the
//! first failure, no chunk after a `finish`, usage before the `finish`, an id on every tool-call
//! delta that stays the same for its block, and the same chunks however the bytes were split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lineage_agent::{Assembler, ModelError};
use lineage_log::StreamChunk;
use lineage_models::{AnswerReader, Wire};

/// Reads `body` in pieces whose sizes come from `cuts`, as the adapter would.
fn read(wire: Wire, body: &[u8], cuts: &[u8]) -> (Vec<StreamChunk>, Option<ModelError>) {
    let mut reader = AnswerReader::new(wire);
    let mut chunks = Vec::new();
    let mut rest = body;
    let mut sizes = cuts.iter().map(|&c| usize::from(c).max(1)).cycle();
    while !rest.is_empty() && !reader.is_done() {
        let size = if cuts.is_empty() {
            rest.len()
        } else {
            sizes.next().unwrap_or(1)
        };
        let (piece, after) = rest.split_at(size.min(rest.len()));
        rest = after;
        if let Err(error) = reader.push(piece, &mut chunks) {
            return (chunks, Some(error));
        }
    }
    match reader.finish(&mut chunks) {
        Ok(()) => (chunks, None),
        Err(error) => (chunks, Some(error)),
    }
}

fn check(chunks: &[StreamChunk]) {
    let mut ids: Vec<(u32, &str)> = Vec::new();
    let mut usage_at = None;
    for (at, chunk) in chunks.iter().enumerate() {
        match chunk {
            StreamChunk::Finish { .. } => {
                assert_eq!(at, chunks.len() - 1, "nothing follows a finish");
            }
            StreamChunk::Usage(_) => usage_at = Some(at),
            StreamChunk::ToolCallDelta(delta) => {
                match ids.iter().find(|(index, _)| *index == delta.index) {
                    Some((_, id)) => {
                        assert_eq!(*id, delta.id.as_str(), "a block keeps its call id")
                    }
                    None => ids.push((delta.index, delta.id.as_str())),
                }
            }
            _ => {}
        }
    }
    if let (Some(usage), Some(StreamChunk::Finish { .. })) = (usage_at, chunks.last()) {
        assert!(usage < chunks.len() - 1, "usage comes before the finish");
    }
    let mut assembler = Assembler::new();
    for chunk in chunks {
        assembler.push(chunk);
    }
    let _ = assembler.blocks();
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let wire = Wire::ALL[usize::from(selector) % Wire::ALL.len()];
    // The next bytes, up to a zero, choose the piece sizes; the rest is the answer.
    let split = rest.iter().position(|&b| b == 0).unwrap_or(0).min(16);
    let (cuts, body) = rest.split_at(split);
    let body = body.strip_prefix(&[0]).unwrap_or(body);
    let (chunks, failure) = read(wire, body, cuts);
    check(&chunks);
    let (whole, whole_failure) = read(wire, body, &[]);
    assert_eq!(chunks, whole, "{wire}: the chunking changed what was read");
    assert_eq!(
        failure.map(|f| f.code),
        whole_failure.map(|f| f.code),
        "{wire}: the chunking changed the failure"
    );
});
