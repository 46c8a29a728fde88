//! Budgets: limits on the turns, model requests, output tokens and time an agent (or its whole
//! delegation tree) may spend, counted from the event that set them.
//!
//! A budget is recorded in the agent's own log as a `custom` event of type [`BUDGET_EVENT`], so
//! a resume restores it and keeps counting where the log left off. Its [`Meter`] counts the
//! turns (`turn/start`), model requests (`step/start`) and reported output tokens
//! (`assistant/message` usage) appended after that event. A tree budget's meter is shared with
//! every child born or resumed while its owner is live, recursively, and each of them charges it
//! too; when the owner is resumed, its meter is rebuilt from the stored descendants' events since
//! the budget's time. The turn loop asks every meter before each model request and ends the turn
//! with [`TurnEndReason::Budget`](lineage_log::TurnEndReason::Budget) at the first limit reached.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lineage_log::{BudgetLimit, BudgetReached, Custom, Event, EventBody, SessionId, own_suffix};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::AgentError;

/// The `custom` event type that records a budget. Readers that do not know it may skip it.
pub const BUDGET_EVENT: &str = "lineage.agent/budget";

/// Limits on what an agent spends, counted from the moment they are set. A limit left `None`
/// does not bind; a limit of zero allows nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Turns started, the one in progress included.
    pub max_turns: Option<u32>,
    /// Model requests (one per step).
    pub max_requests: Option<u32>,
    /// Output tokens, as the model reports them.
    pub max_output_tokens: Option<u64>,
    /// Time since the budget was set.
    pub max_wall: Option<Duration>,
    /// Whether it binds the agent's delegation tree too: every child, and theirs, charges it.
    pub tree: bool,
}

impl Budget {
    /// A budget on this agent alone, with no limit yet.
    pub fn agent() -> Budget {
        Budget::default()
    }

    /// A budget on this agent and every agent it delegates to, with no limit yet.
    pub fn tree() -> Budget {
        Budget {
            tree: true,
            ..Budget::default()
        }
    }

    /// With at most `n` turns.
    pub fn turns(self, n: u32) -> Budget {
        Budget {
            max_turns: Some(n),
            ..self
        }
    }

    /// With at most `n` model requests.
    pub fn requests(self, n: u32) -> Budget {
        Budget {
            max_requests: Some(n),
            ..self
        }
    }

    /// With at most `n` output tokens.
    pub fn output_tokens(self, n: u64) -> Budget {
        Budget {
            max_output_tokens: Some(n),
            ..self
        }
    }

    /// With at most `wall` of time.
    pub fn wall(self, wall: Duration) -> Budget {
        Budget {
            max_wall: Some(wall),
            ..self
        }
    }

    /// The event that records this budget.
    pub(crate) fn event(&self) -> EventBody {
        let mut payload = Map::new();
        let mut put = |field: &str, value: Option<u64>| {
            if let Some(value) = value {
                payload.insert(field.into(), value.into());
            }
        };
        put("max_turns", self.max_turns.map(u64::from));
        put("max_requests", self.max_requests.map(u64::from));
        put("max_output_tokens", self.max_output_tokens);
        put("max_wall_ms", self.max_wall.map(duration_ms));
        payload.insert("tree".into(), self.tree.into());
        Custom {
            type_name: BUDGET_EVENT.into(),
            payload: Value::Object(payload).to_string().into(),
            ignorable: true,
        }
        .into()
    }

    /// The budget a [`BUDGET_EVENT`] record holds; a malformed one is refused naming its seq and
    /// field.
    fn parse(agent: SessionId, event: &Event, payload: &str) -> Result<Budget, AgentError> {
        let invalid = |reason: String| AgentError::InvalidBudget {
            agent,
            seq: event.seq,
            reason,
        };
        let value: Value =
            serde_json::from_str(payload).map_err(|e| invalid(format!("is not JSON: {e}")))?;
        let object = value
            .as_object()
            .ok_or_else(|| invalid("is not a JSON object".into()))?;
        let number = |field: &str| -> Result<Option<u64>, AgentError> {
            match object.get(field) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| invalid(format!("field {field} is not a whole number"))),
            }
        };
        let small = |field: &str| -> Result<Option<u32>, AgentError> {
            number(field)?
                .map(|n| {
                    u32::try_from(n)
                        .map_err(|_| invalid(format!("field {field} does not fit 32 bits")))
                })
                .transpose()
        };
        let tree = match object.get("tree") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid("field tree is not a boolean".into()))?,
        };
        Ok(Budget {
            max_turns: small("max_turns")?,
            max_requests: small("max_requests")?,
            max_output_tokens: number("max_output_tokens")?,
            max_wall: number("max_wall_ms")?.map(Duration::from_millis),
            tree,
        })
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a budget has counted so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetUse {
    /// Turns started.
    pub turns: u64,
    /// Model requests made.
    pub requests: u64,
    /// Output tokens reported.
    pub output_tokens: u64,
}

impl BudgetUse {
    /// Counts `body` if it is something a budget limits.
    fn charge(&mut self, body: &EventBody) {
        match body {
            EventBody::TurnStart(_) => self.turns += 1,
            EventBody::StepStart(_) => self.requests += 1,
            EventBody::AssistantMessage(m) => {
                if let Some(usage) = &m.usage {
                    self.output_tokens = self.output_tokens.saturating_add(usage.output_tokens);
                }
            }
            _ => {}
        }
    }

    fn charge_all<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for event in events {
            self.charge(&event.body);
        }
    }
}

/// A budget in force: its limits, its owner, its deadline and what it has counted. Shared by
/// every agent it binds.
#[derive(Debug)]
pub(crate) struct Meter {
    owner: SessionId,
    budget: Budget,
    deadline: Option<Instant>,
    used: Mutex<BudgetUse>,
}

impl Meter {
    /// A meter for `budget`, set `elapsed` ago, that has counted `used`.
    fn new(owner: SessionId, budget: Budget, elapsed: Duration, used: BudgetUse) -> Arc<Meter> {
        let deadline = budget
            .max_wall
            .map(|wall| Instant::now() + wall.saturating_sub(elapsed));
        Arc::new(Meter {
            owner,
            budget,
            deadline,
            used: Mutex::new(used),
        })
    }

    /// The session whose budget it is.
    pub(crate) fn owner(&self) -> SessionId {
        self.owner
    }

    /// Whether it binds the owner's children too.
    pub(crate) fn binds_tree(&self) -> bool {
        self.budget.tree
    }

    pub(crate) fn charge(&self, body: &EventBody) {
        crate::agent::lock(&self.used).charge(body);
    }

    /// What it has counted.
    pub(crate) fn used(&self) -> BudgetUse {
        *crate::agent::lock(&self.used)
    }

    pub(crate) fn budget(&self) -> Budget {
        self.budget
    }

    /// The first limit reached, checked before a model request: the turn in progress is
    /// counted, so `max_turns` turns may run; requests and tokens may not go past their limit.
    pub(crate) fn reached(&self) -> Option<BudgetReached> {
        let used = self.used();
        let b = &self.budget;
        let over = |max: Option<u64>, used: u64, strictly: bool| {
            max.filter(|&max| if strictly { used > max } else { used >= max })
        };
        let hit = over(b.max_turns.map(u64::from), used.turns, true)
            .map(|max| (BudgetLimit::Turns, max))
            .or_else(|| {
                over(b.max_requests.map(u64::from), used.requests, false)
                    .map(|max| (BudgetLimit::Requests, max))
            })
            .or_else(|| {
                over(b.max_output_tokens, used.output_tokens, false)
                    .map(|max| (BudgetLimit::OutputTokens, max))
            })
            .or_else(|| {
                let deadline = self.deadline?;
                (Instant::now() >= deadline)
                    .then(|| (BudgetLimit::WallClock, b.max_wall.map_or(0, duration_ms)))
            });
        hit.map(|(limit, max)| BudgetReached {
            limit,
            max,
            owner: self.owner,
        })
    }
}

/// The last budget recorded in the own suffix of `events`, with its event.
pub(crate) fn recorded(
    agent: SessionId,
    events: &[Event],
) -> Result<Option<(Budget, &Event)>, AgentError> {
    let found = own_suffix(events).iter().rev().find_map(|e| match &e.body {
        EventBody::Custom(c) if c.type_name.as_str() == BUDGET_EVENT => Some((e, c)),
        _ => None,
    });
    found
        .map(|(event, custom)| {
            Budget::parse(agent, event, custom.payload.as_str()).map(|b| (b, event))
        })
        .transpose()
}

/// The meter of the budget recorded in `events`, if any: counting the events after its record,
/// plus (for a tree budget) `descendants`' use since its time, and set `now_ms - its time` ago.
pub(crate) fn own_meter(
    agent: SessionId,
    events: &[Event],
    now_ms: i64,
    descendants: impl FnOnce(i64) -> BudgetUse,
) -> Result<Option<Arc<Meter>>, AgentError> {
    let Some((budget, record)) = recorded(agent, events)? else {
        return Ok(None);
    };
    let mut used = if budget.tree {
        descendants(record.time_ms)
    } else {
        BudgetUse::default()
    };
    used.charge_all(&events[(record.seq as usize + 1).min(events.len())..]);
    let elapsed = Duration::from_millis(u64::try_from(now_ms - record.time_ms).unwrap_or(0));
    Ok(Some(Meter::new(agent, budget, elapsed, used)))
}

/// What the own suffix of a descendant's `events` spent from `since_ms` on.
pub(crate) fn use_since(events: &[Event], since_ms: i64) -> BudgetUse {
    let mut used = BudgetUse::default();
    used.charge_all(own_suffix(events).iter().filter(|e| e.time_ms >= since_ms));
    used
}

impl std::ops::AddAssign for BudgetUse {
    fn add_assign(&mut self, other: BudgetUse) {
        self.turns += other.turns;
        self.requests += other.requests;
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lineage_log::{AssistantMessage, Message, MessageSource, StepStart, TurnStart, Usage};

    fn event(seq: u64, time_ms: i64, body: impl Into<EventBody>) -> Event {
        Event::new(seq, time_ms, body)
    }

    fn answer(output_tokens: u64) -> EventBody {
        let mut message = Message::user_text("x", MessageSource::User);
        message.role = lineage_log::Role::Assistant;
        EventBody::AssistantMessage(Box::new(AssistantMessage {
            turn: 1,
            step: 1,
            message,
            usage: Some(Usage {
                input_tokens: 1,
                output_tokens,
                cache_read_tokens: None,
            }),
            interrupted: false,
        }))
    }

    #[test]
    fn a_budget_round_trips_through_its_record() {
        let id = SessionId::new();
        let budget = Budget::tree()
            .turns(3)
            .requests(20)
            .output_tokens(5000)
            .wall(Duration::from_secs(90));
        let events = [event(0, 1_000, budget.event())];
        let (parsed, _) = recorded(id, &events).unwrap().expect("recorded");
        assert_eq!(parsed, budget);
        let none = [event(0, 1_000, Budget::agent().event())];
        assert_eq!(recorded(id, &none).unwrap().unwrap().0, Budget::agent());
    }

    #[test]
    fn a_malformed_record_is_refused_naming_its_seq_and_field() {
        let id = SessionId::new();
        for (payload, field) in [
            (r#"{"max_turns": -1}"#, "max_turns"),
            (r#"{"max_requests": 4294967296}"#, "max_requests"),
            (r#"{"tree": "yes"}"#, "tree"),
            ("[]", "object"),
            ("{", "JSON"),
        ] {
            let body = Custom {
                type_name: BUDGET_EVENT.into(),
                payload: payload.into(),
                ignorable: true,
            };
            let events = [event(0, 0, TurnStart { turn: 1 }), event(1, 0, body)];
            let error = recorded(id, &events).unwrap_err().to_string();
            assert!(error.contains("seq 1") && error.contains(field), "{error}");
            assert!(error.contains(&id.to_string()), "{error}");
        }
    }

    #[test]
    fn a_meter_counts_only_what_came_after_its_record_and_the_last_record_wins() {
        let id = SessionId::new();
        let events = [
            event(0, 0, Budget::agent().requests(1).event()),
            event(1, 0, TurnStart { turn: 1 }),
            event(2, 0, StepStart { turn: 1, step: 1 }),
            event(3, 0, Budget::agent().requests(2).turns(1).event()),
            event(4, 0, StepStart { turn: 1, step: 2 }),
            event(5, 0, answer(7)),
        ];
        let meter = own_meter(id, &events, 0, |_| unreachable!("not a tree budget"))
            .unwrap()
            .expect("a meter");
        assert_eq!(
            meter.used(),
            BudgetUse {
                turns: 0,
                requests: 1,
                output_tokens: 7
            }
        );
        assert_eq!(meter.reached(), None);
        meter.charge(&TurnStart { turn: 2 }.into());
        assert_eq!(meter.reached(), None, "the turn in progress may run");
        meter.charge(&TurnStart { turn: 3 }.into());
        let reached = meter.reached().expect("two turns past a limit of one");
        assert_eq!(
            (reached.limit, reached.max, reached.owner),
            (BudgetLimit::Turns, 1, id)
        );
    }

    #[test]
    fn requests_and_tokens_may_not_go_past_their_limit() {
        let id = SessionId::new();
        let meter = Meter::new(
            id,
            Budget::agent().requests(2).output_tokens(100),
            Duration::ZERO,
            BudgetUse::default(),
        );
        meter.charge(&StepStart { turn: 1, step: 1 }.into());
        assert_eq!(meter.reached(), None);
        meter.charge(&StepStart { turn: 1, step: 2 }.into());
        assert_eq!(
            meter.reached().map(|r| r.limit),
            Some(BudgetLimit::Requests)
        );

        let meter = Meter::new(
            id,
            Budget::agent().output_tokens(100),
            Duration::ZERO,
            BudgetUse::default(),
        );
        meter.charge(&answer(99));
        assert_eq!(meter.reached(), None);
        meter.charge(&answer(1));
        assert_eq!(
            meter.reached().map(|r| (r.limit, r.max)),
            Some((BudgetLimit::OutputTokens, 100))
        );
        let zero = Meter::new(
            id,
            Budget::agent().turns(0),
            Duration::ZERO,
            BudgetUse::default(),
        );
        zero.charge(&TurnStart { turn: 1 }.into());
        assert!(zero.reached().is_some(), "a limit of zero allows nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn the_wall_clock_counts_from_the_record_across_a_resume() {
        let id = SessionId::new();
        let events = [event(
            0,
            10_000,
            Budget::agent().wall(Duration::from_secs(60)).event(),
        )];
        // Resumed 45 s after the budget was set: 15 s are left.
        let meter = own_meter(id, &events, 55_000, |_| BudgetUse::default())
            .unwrap()
            .unwrap();
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(meter.reached(), None);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            meter.reached().map(|r| (r.limit, r.max)),
            Some((BudgetLimit::WallClock, 60_000))
        );
    }

    #[test]
    fn a_tree_meter_adds_the_descendants_use_since_its_time() {
        let id = SessionId::new();
        let events = [
            event(0, 5_000, Budget::tree().requests(10).event()),
            event(1, 5_000, StepStart { turn: 1, step: 1 }),
        ];
        let child = [
            event(0, 4_000, StepStart { turn: 1, step: 1 }),
            event(1, 5_000, StepStart { turn: 1, step: 2 }),
            event(2, 6_000, StepStart { turn: 1, step: 3 }),
        ];
        let meter = own_meter(id, &events, 6_000, |since| use_since(&child, since))
            .unwrap()
            .unwrap();
        assert_eq!(
            meter.used().requests,
            3,
            "the root's one and the child's two since 5 s"
        );
    }
}
