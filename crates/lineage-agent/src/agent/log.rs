//! The agent's log: `append`, the one path by which an event reaches memory and the store
//! (checked against the log, admitted to the store, then applied, charged to the budgets and
//! published; a refused append changes nothing), flushing, and reads of the log.

use std::time::{SystemTime, UNIX_EPOCH};

use lineage_log::{Event, EventBody, Message, check_append, fold_delegation_depth};
use lineage_store::StoreError;

use super::{Agent, State, lock};
use crate::{AgentError, AgentEvent};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Agent {
    /// Appends one event: checked against the log, admitted to the store, then applied in memory
    /// and published. Returns its seq.
    pub(super) fn append(&self, body: impl Into<EventBody>) -> Result<u64, AgentError> {
        self.append_locked(&mut lock(&self.state), body.into())
    }

    /// [`Agent::append`] under the state lock the caller holds.
    pub(super) fn append_locked(&self, st: &mut State, body: EventBody) -> Result<u64, AgentError> {
        if st.released {
            return Err(AgentError::NotLive { agent: self.id });
        }
        if let Some(stopped) = &st.stopped {
            return Err(stopped.refusal(self.id));
        }
        let event = Event::new(st.log.next_seq(), now_ms(), body);
        let batch = std::slice::from_ref(&event);
        let log_error = |source| AgentError::Log {
            agent: self.id,
            source,
        };
        check_append(st.log.structure(), batch).map_err(log_error)?;
        if let Err(source) = self.store.admit(self.id, batch) {
            return Err(self.store_failed(st, source));
        }
        let seq = event.seq;
        let published = (!st.subscribers.is_empty()).then(|| event.clone());
        st.log.append(vec![event]).map_err(log_error)?;
        if let Some(appended) = st.log.events().last() {
            for meter in &self.meters {
                meter.charge(&appended.body);
            }
        }
        if let Some(event) = published {
            st.subscribers.publish(AgentEvent::Appended {
                agent: self.id,
                event,
            });
        }
        Ok(seq)
    }

    /// Records a host event in the agent's session: an `approval/policy` or `sandbox/mode` switch,
    /// or a `custom` event. Durable at the next flush, like every event. Other kinds belong to the
    /// runtime (they would desynchronise the inbox or the turn structure) and are refused.
    pub fn record(&self, body: impl Into<EventBody>) -> Result<u64, AgentError> {
        let body = body.into();
        match body {
            EventBody::ApprovalPolicy(_) | EventBody::SandboxMode(_) | EventBody::Custom(_) => {
                self.append(body)
            }
            other => Err(AgentError::NotRecordable {
                agent: self.id,
                kind: other.kind().name(),
            }),
        }
    }

    /// Waits until everything the agent has appended is durable.
    ///
    /// Cancel safety: dropping the future stops only the wait; the flush completes in the store's
    /// writer, and a later flush covers everything this one did.
    pub async fn flush(&self) -> Result<(), AgentError> {
        match self.flush_store().await {
            Ok(()) => Ok(()),
            Err(source) => Err(self.store_failed(&mut lock(&self.state), source)),
        }
    }

    /// Flushes the session in the store's writer, off the runtime's threads.
    pub(super) async fn flush_store(&self) -> Result<(), StoreError> {
        let store = self.store.clone();
        let id = self.id;
        match tokio::task::spawn_blocking(move || store.flush(id)).await {
            Ok(result) => result,
            // The closure only calls into the store; a panic there is the storage engine's and is
            // reported as a damaged store.
            Err(join) => Err(StoreError::Damaged {
                reason: join.to_string(),
            }),
        }
    }

    /// A copy of the session's events so far.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.state).log.events().to_vec()
    }

    /// Runs `f` over the session's events without copying them.
    pub fn with_events<R>(&self, f: impl FnOnce(&[Event]) -> R) -> R {
        f(lock(&self.state).log.events())
    }

    /// The model's history now: what the next request carries.
    pub(super) fn history(&self) -> Vec<Message> {
        lock(&self.state)
            .log
            .events()
            .iter()
            .filter_map(|e| e.body.history_message().cloned())
            .collect()
    }

    /// The delegation depth in force: the larger of the session's own lineage depth and the
    /// runtime option.
    pub fn delegation_depth(&self) -> u32 {
        fold_delegation_depth(lock(&self.state).log.events(), self.options.subagent_depth)
    }
}
