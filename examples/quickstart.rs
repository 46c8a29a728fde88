//! Creates a store in a temporary directory, writes a turn, forks it, reloads, verifies, and says
//! what it did.

use std::error::Error;
use std::time::{SystemTime, UNIX_EPOCH};

use lineage::log::{
    AssistantMessage, ContentBlock, Event, EventBody, ForkSpec, Header, Message, MessageId,
    MessageSource, Role, SessionId, StepEnd, StepStart, TurnEnd, TurnEndReason, TurnStart, Usage,
    model_history,
};
use lineage::store::Store;

fn main() -> Result<(), Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("lineage-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("sessions.lineage");
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;

    let store = Store::open(&path)?;
    println!("opened store {} at {}", store.store_id(), path.display());

    // One completed turn: the user asks, the model answers.
    let parent = SessionId::new();
    store.create(Header::new(parent, now as u64).with_cwd(dir.to_string_lossy().as_ref()))?;
    let answer = Message {
        id: MessageId::new(),
        role: Role::Assistant,
        content: vec![ContentBlock::text("Event sourcing: the log is the truth.")],
        source: MessageSource::Model {
            endpoint: "scripted".into(),
            model: "demo-1".into(),
        },
    };
    let turn: Vec<EventBody> = vec![
        TurnStart { turn: 1 }.into(),
        StepStart { turn: 1, step: 1 }.into(),
        Message::user_text("What keeps a session durable?", MessageSource::User).into(),
        AssistantMessage {
            turn: 1,
            step: 1,
            message: answer,
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 9,
                cache_read_tokens: None,
            }),
            interrupted: false,
        }
        .into(),
        StepEnd { turn: 1, step: 1 }.into(),
        TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
        }
        .into(),
    ];
    let events: Vec<Event> = turn
        .into_iter()
        .enumerate()
        .map(|(seq, body)| Event::new(seq as u64, now + seq as i64, body))
        .collect();
    store.append(parent, &events)?;
    println!(
        "wrote session {parent}: {} events, one completed turn",
        events.len()
    );

    // A second turn that the process "crashes" in: it opens and never closes.
    store.append(parent, &[Event::new(6, now + 6, TurnStart { turn: 2 })])?;

    // Fork the parent at its last completed turn.
    let child = SessionId::new();
    let header = store.fork(
        parent,
        &ForkSpec {
            child,
            boundary: Some(5),
            time_ms: now as u64 + 7,
            delegation_depth: 0,
            agent_preset: None,
        },
    )?;
    println!(
        "forked {child} from {parent}: inherits {} events, seed digest {}",
        header.seed_len,
        header
            .seed_digest
            .map(|d| d.to_string())
            .unwrap_or_default()
    );
    drop(store);

    // Reopen, as after a restart, and load: crash repair closes the open turn durably.
    let store = Store::open(&path)?;
    let loaded = store.load(parent)?;
    println!(
        "reloaded {parent}: {} events, {} appended by crash repair (last: {})",
        loaded.events.len(),
        loaded.closers,
        loaded
            .events
            .last()
            .map(|e| e.kind().name())
            .unwrap_or("none"),
    );
    let forked = store.load(child)?;
    let children: Vec<String> = store
        .children(parent)?
        .iter()
        .map(|c| c.to_string())
        .collect();
    println!(
        "reloaded {child}: {} events, {} messages of history; the parent's children: {}",
        forked.events.len(),
        model_history(&forked.events).len(),
        children.join(", "),
    );

    let report = store.verify()?;
    for session in &report.sessions {
        println!(
            "verified {}: {} events in {} block{}, {}",
            session.session,
            session.events,
            session.blocks,
            if session.blocks == 1 { "" } else { "s" },
            if session.problems.is_empty() {
                "intact"
            } else {
                "PROBLEMS"
            }
        );
    }
    if !report.is_ok() {
        return Err("verify found problems".into());
    }
    drop(store);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
