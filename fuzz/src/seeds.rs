//! The seed inputs under `fuzz/seeds/`, made by the store itself (`cargo run --example
//! make_seeds`): the fuzzer starts from real files and real logs and mutates them, instead of
//! having to discover the storage engine's format from nothing.

use lineage_log::{
    AssistantMessage, CallId, ContentBlock, Encoder, Event, ForkSpec, Header, Message, MessageId,
    MessageSource, Role, SessionId, StepStart, Structure, Text, ToolCall, TurnStart, fold_header,
};
use lineage_store::{Store, StoreOptions};
use lineage_testkit::{realistic_session, valid_log_from_ops};

use crate::backend::SharedMemory;

fn id(n: u128) -> SessionId {
    SessionId::from_u128(0x0197_0000_0000_7000_8000_0000_0000_0000 | n)
}

fn options(block_events: usize) -> StoreOptions {
    StoreOptions {
        commit_window: std::time::Duration::ZERO,
        block_events,
        cache_bytes: 1 << 20,
        ..StoreOptions::default()
    }
}

/// A store made by `fill`, as the bytes of its file.
fn store_bytes(block_events: usize, fill: impl FnOnce(&Store)) -> Vec<u8> {
    let memory = SharedMemory::default();
    let shared = memory.clone();
    let store = Store::with_backend_factory(move || shared.clone(), options(block_events))
        .expect("a fresh store opens");
    fill(&store);
    store.close().expect("the seed store closes");
    memory.bytes().expect("memory reads back")
}

/// Events that open turn `turn` after `events` and stop mid-step, with a started call and an
/// asked-for call unanswered: what a writer killed mid-turn leaves.
fn interrupted_turn(events: &[Event]) -> Vec<Event> {
    let structure = Structure::of_valid_log(events).expect("a valid log");
    let (seq, time) = (events.len() as u64, events.last().map_or(0, |e| e.time_ms));
    let turn = structure.last_turn() + 1;
    let asked = |n: &str| ContentBlock::ToolCall {
        id: CallId::new(n),
        name: Text::from_static("read_file"),
        arguments: Text::from_static("{\"path\":\"src/lib.rs\"}"),
    };
    vec![
        Event::new(seq, time + 1, TurnStart { turn }),
        Event::new(seq + 1, time + 2, StepStart { turn, step: 1 }),
        Event::new(
            seq + 2,
            time + 3,
            AssistantMessage {
                turn,
                step: 1,
                message: Message {
                    id: MessageId::derived(&[b"seed", &seq.to_le_bytes()]),
                    role: Role::Assistant,
                    content: vec![asked("call-a"), asked("call-b")],
                    source: MessageSource::Model {
                        endpoint: Text::from_static("scripted"),
                        model: Text::from_static("seed"),
                    },
                },
                usage: None,
                interrupted: false,
            },
        ),
        Event::new(
            seq + 3,
            time + 4,
            ToolCall {
                turn,
                step: 1,
                call_id: CallId::new("call-a"),
                name: Text::from_static("read_file"),
                arguments: Text::from_static("{\"path\":\"src/lib.rs\"}"),
            },
        ),
    ]
}

/// Seed store files, by name: an empty store; one balanced session; a parent with a forked child
/// whose tail turn was interrupted; many short sessions in many small blocks; a session of every
/// event kind left mid-turn.
pub fn stores() -> Vec<(&'static str, Vec<u8>)> {
    let empty = store_bytes(512, |_| {});
    let one = store_bytes(512, |store| {
        store
            .import(Header::new(id(1), 1), &realistic_session(1, 80))
            .expect("import");
    });
    let family = store_bytes(64, |store| {
        let parent = realistic_session(2, 120);
        store
            .import(Header::new(id(1), 1), &parent)
            .expect("import");
        let spec = ForkSpec {
            child: id(2),
            boundary: None,
            time_ms: 2,
            delegation_depth: 1,
            agent_preset: None,
        };
        store.fork(id(1), &spec).expect("fork");
        let child = store.inspect(id(2)).expect("the child reads").events;
        store
            .append(id(2), &interrupted_turn(&child))
            .expect("append");
    });
    let many = store_bytes(4, |store| {
        for n in 1..=8 {
            store
                .import(
                    Header::new(id(n), n as u64),
                    &realistic_session(n as u64, 24),
                )
                .expect("import");
        }
    });
    let kinds = store_bytes(16, |store| {
        let ops: Vec<u64> = (0..160u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let log = valid_log_from_ops(1_750_000_000_000, &ops, 4, false);
        let header = fold_header(&Header::new(id(1), 1), &log);
        store.import(header, &log).expect("import");
    });
    vec![
        ("empty", empty),
        ("one-session", one),
        ("fork-interrupted", family),
        ("many-sessions", many),
        ("every-kind", kinds),
    ]
}

/// Seed inputs of the `log_repair` target, by name: records of realistic and interrupted logs
/// (source byte 0), generator ops (source byte 1) and aimed events (source byte 2), each after
/// the target's option bytes.
pub fn logs() -> Vec<(&'static str, Vec<u8>)> {
    let options = [4u8, 0x01, 0x00, 7, 7, 7, 7, 7, 7, 7, 7];
    let with = |source: u8, body: &[u8]| {
        let mut input = vec![source];
        input.extend_from_slice(&options);
        input.extend_from_slice(body);
        input
    };
    let records = |events: &[Event]| {
        let mut out = Vec::new();
        Encoder::new().encode_all(events, &mut out);
        out
    };
    let balanced = realistic_session(3, 60);
    let mut interrupted = balanced.clone();
    interrupted.extend(interrupted_turn(&balanced));
    let ops: Vec<u8> = (0..96u64)
        .flat_map(|i| i.wrapping_mul(0xBF58_476D_1CE4_E5B9).to_be_bytes())
        .collect();
    let mut machine = vec![0, 0, 1, 0x9a, 0x2b, 0, 0, 0, 3, 0];
    machine.extend_from_slice(&ops);
    let ops_log = valid_log_from_ops(-5, &(0..120u64).collect::<Vec<_>>(), 3, false);
    vec![
        ("records-every-kind", with(0, &records(&ops_log))),
        ("records-balanced", with(0, &records(&balanced))),
        ("records-interrupted", with(0, &records(&interrupted))),
        ("machine", with(1, &machine)),
        ("events", with(2, &ops)),
    ]
}

/// Seed inputs of the `decode_records` target: the records of a realistic log and of a log of
/// every event kind, back to back.
pub fn records() -> Vec<(&'static str, Vec<u8>)> {
    let encode = |events: &[Event]| {
        let mut out = Vec::new();
        Encoder::new().encode_all(events, &mut out);
        out
    };
    let ops: Vec<u64> = (0..120u64).collect();
    vec![
        ("realistic", encode(&realistic_session(4, 40))),
        (
            "every-kind",
            encode(&valid_log_from_ops(-5, &ops, 3, false)),
        ),
    ]
}

/// Answers in each wire format, as `model_stream` reads its input: the format's selector byte,
/// piece sizes up to a zero byte, then the answer's bytes.
pub fn model_streams() -> Vec<(&'static str, Vec<u8>)> {
    use lineage_testkit::loopback::{anthropic, chat, responses};
    let calls: [(&str, &str, &[&str]); 2] = [
        ("call_a", "read_file", &["{\"path\":", " \"a.txt\"}"]),
        ("call_b", "list_dir", &["{\"path\"", ": \".\"}"]),
    ];
    let answers: [(&'static str, u8, Vec<u8>); 9] = [
        (
            "chat-text",
            0,
            chat::Script::new()
                .reasoning("hm")
                .text("Hel")
                .text("lo")
                .usage(9, 2, Some(1))
                .stop()
                .body(),
        ),
        (
            "chat-tools",
            0,
            chat::Script::new()
                .parallel_tool_calls(&calls)
                .tool_stop()
                .body(),
        ),
        (
            "chat-error",
            0,
            chat::Script::new()
                .text("x")
                .error("overloaded", "busy")
                .body(),
        ),
        (
            "responses-text",
            1,
            responses::Script::new()
                .reasoning("hm")
                .text("Hello")
                .usage(9, 2, Some(1))
                .stop()
                .body(),
        ),
        (
            "responses-tools",
            1,
            responses::Script::new()
                .parallel_tool_calls(&calls)
                .tool_stop()
                .body(),
        ),
        (
            "responses-incomplete",
            1,
            responses::Script::new()
                .text("cut")
                .finish("max_output_tokens")
                .body(),
        ),
        (
            "anthropic-text",
            2,
            anthropic::Script::new()
                .reasoning("hm")
                .text("Hello")
                .usage(9, 2, Some(1))
                .stop()
                .body(),
        ),
        (
            "anthropic-tools",
            2,
            anthropic::Script::new()
                .parallel_tool_calls(&calls)
                .tool_stop()
                .body(),
        ),
        (
            "anthropic-error",
            2,
            anthropic::Script::new()
                .text("x")
                .error("overloaded", "busy")
                .body(),
        ),
    ];
    answers
        .into_iter()
        .map(|(name, wire, body)| {
            let mut input = vec![wire, 7, 3, 0];
            input.extend_from_slice(&body);
            (name, input)
        })
        .collect()
}
