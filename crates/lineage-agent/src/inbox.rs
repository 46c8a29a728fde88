//! The inbox: the agent's only queue. Two FIFO lists, `next-turn` (each prompt starts a turn) and
//! `next-step` (input that joins the nearest step), changed only through splices that are logged
//! before memory changes.
//!
//! This module is pure: it plans and applies splices. The agent logs each planned splice as
//! `inbox/spliced` first and applies it only once the log accepted it.

use std::collections::VecDeque;

use lineage_log::{Event, EventBody, InboxSpliced, InboxTarget, Message, MessageId, Role};

/// The two pending lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inbox {
    next_turn: VecDeque<Message>,
    next_step: VecDeque<Message>,
}

impl Inbox {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// The inbox that the splices of `own` (a session's own suffix) leave. A fork child's
    /// inherited splices are its parent's business and are not replayed. Errors name the seq of
    /// the splice that does not apply.
    pub fn replay(own: &[Event]) -> Result<Self, (u64, String)> {
        let mut inbox = Inbox::new();
        for event in own {
            if let EventBody::InboxSpliced(splice) = &event.body {
                inbox.check(splice).map_err(|reason| (event.seq, reason))?;
                inbox.apply(splice);
            }
        }
        Ok(inbox)
    }

    /// The list `target`.
    pub fn list(&self, target: InboxTarget) -> &VecDeque<Message> {
        match target {
            InboxTarget::NextTurn => &self.next_turn,
            InboxTarget::NextStep => &self.next_step,
        }
    }

    fn list_mut(&mut self, target: InboxTarget) -> &mut VecDeque<Message> {
        match target {
            InboxTarget::NextTurn => &mut self.next_turn,
            InboxTarget::NextStep => &mut self.next_step,
        }
    }

    /// Whether anything is pending in either list.
    pub fn has_pending(&self) -> bool {
        !self.next_turn.is_empty() || !self.next_step.is_empty()
    }

    /// Where `id` is pending, if it is.
    pub fn position(&self, id: MessageId) -> Option<(InboxTarget, usize)> {
        [InboxTarget::NextStep, InboxTarget::NextTurn]
            .into_iter()
            .find_map(|t| self.list(t).iter().position(|m| m.id == id).map(|i| (t, i)))
    }

    /// Checks that `splice` applies: its range lies inside its list, every inserted message is a
    /// user message, and no inserted id is pending (in either list, outside the removed range) or
    /// inserted twice.
    pub fn check(&self, splice: &InboxSpliced) -> Result<(), String> {
        let list = self.list(splice.target);
        let (start, removed) = (splice.start as usize, splice.removed as usize);
        if start > list.len() || removed > list.len() - start {
            return Err(format!(
                "removes {removed} at {start} from a list of {}",
                list.len()
            ));
        }
        for (i, message) in splice.inserted.iter().enumerate() {
            if message.role != Role::User {
                return Err(format!(
                    "inserts message {} with a role other than user",
                    message.id
                ));
            }
            let pending_elsewhere = [InboxTarget::NextTurn, InboxTarget::NextStep]
                .into_iter()
                .flat_map(|t| {
                    self.list(t).iter().enumerate().filter(move |(at, _)| {
                        t != splice.target || *at < start || *at >= start + removed
                    })
                })
                .any(|(_, m)| m.id == message.id);
            if pending_elsewhere || splice.inserted[..i].iter().any(|m| m.id == message.id) {
                return Err(format!("message {} is already pending", message.id));
            }
        }
        Ok(())
    }

    /// Applies a checked splice and returns the messages it removed.
    pub fn apply(&mut self, splice: &InboxSpliced) -> Vec<Message> {
        let list = self.list_mut(splice.target);
        let start = splice.start as usize;
        let removed: Vec<Message> = list.drain(start..start + splice.removed as usize).collect();
        for (offset, message) in splice.inserted.iter().enumerate() {
            list.insert(start + offset, message.clone());
        }
        removed
    }

    /// The splice that appends `message` to `target`.
    pub fn append_splice(&self, target: InboxTarget, message: Message) -> InboxSpliced {
        InboxSpliced {
            target,
            start: len_u32(self.list(target).len()),
            removed: 0,
            inserted: vec![message],
            canceled: false,
        }
    }

    /// The splices that clear both lists, cancelling their messages: `next-step` first, then
    /// `next-turn`, one per non-empty list.
    pub fn clear_splices(&self) -> Vec<InboxSpliced> {
        [InboxTarget::NextStep, InboxTarget::NextTurn]
            .into_iter()
            .filter(|t| !self.list(*t).is_empty())
            .map(|target| InboxSpliced {
                target,
                start: 0,
                removed: len_u32(self.list(target).len()),
                inserted: Vec::new(),
                canceled: true,
            })
            .collect()
    }

    /// The splices that claim input for a step: all of `next-step`, and for a turn's first step
    /// also the first `next-turn` prompt. Claims are deletions, not cancellations. Claimed
    /// messages come out step input first, then the prompt.
    pub fn claim_splices(&self, target: InboxTarget) -> Vec<InboxSpliced> {
        let mut splices = Vec::new();
        if !self.next_step.is_empty() {
            splices.push(InboxSpliced {
                target: InboxTarget::NextStep,
                start: 0,
                removed: len_u32(self.next_step.len()),
                inserted: Vec::new(),
                canceled: false,
            });
        }
        if target == InboxTarget::NextTurn && !self.next_turn.is_empty() {
            splices.push(InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed: 1,
                inserted: Vec::new(),
                canceled: false,
            });
        }
        splices
    }

    /// The splice that removes the pending message `id`, cancelling it.
    pub fn remove_splice(&self, id: MessageId) -> Option<InboxSpliced> {
        let (target, at) = self.position(id)?;
        Some(InboxSpliced {
            target,
            start: len_u32(at),
            removed: 1,
            inserted: Vec::new(),
            canceled: true,
        })
    }
}

fn len_u32(len: usize) -> u32 {
    // An inbox of four billion pending messages is not a state any host reaches; saturate rather
    // than wrap if one ever does, and the splice check then refuses the splice.
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lineage_log::MessageSource;

    fn msg(text: &str) -> Message {
        Message::user_text(text, MessageSource::User)
    }

    fn apply(inbox: &mut Inbox, splice: InboxSpliced) -> Vec<Message> {
        inbox.check(&splice).unwrap();
        inbox.apply(&splice)
    }

    #[test]
    fn claims_take_all_step_input_before_the_first_prompt() {
        let mut inbox = Inbox::new();
        let (p1, p2, s1) = (msg("p1"), msg("p2"), msg("s1"));
        for (t, m) in [
            (InboxTarget::NextTurn, &p1),
            (InboxTarget::NextTurn, &p2),
            (InboxTarget::NextStep, &s1),
        ] {
            let s = inbox.append_splice(t, m.clone());
            apply(&mut inbox, s);
        }
        let claimed: Vec<Message> = inbox
            .claim_splices(InboxTarget::NextTurn)
            .into_iter()
            .flat_map(|s| apply(&mut inbox, s))
            .collect();
        assert_eq!(claimed, vec![s1, p1]);
        assert_eq!(inbox.list(InboxTarget::NextTurn).len(), 1);
        assert!(inbox.claim_splices(InboxTarget::NextStep).is_empty());
        assert!(
            inbox
                .claim_splices(InboxTarget::NextTurn)
                .iter()
                .all(|s| !s.canceled)
        );
        assert_eq!(inbox.position(p2.id), Some((InboxTarget::NextTurn, 0)));
    }

    #[test]
    fn a_pending_id_cannot_be_inserted_again_in_either_list() {
        let mut inbox = Inbox::new();
        let m = msg("x");
        let s = inbox.append_splice(InboxTarget::NextTurn, m.clone());
        apply(&mut inbox, s);
        let again = inbox.append_splice(InboxTarget::NextStep, m.clone());
        assert!(inbox.check(&again).unwrap_err().contains("already pending"));
        // Replacing a message by itself, in place, is fine: it leaves the removed range.
        let replace = InboxSpliced {
            target: InboxTarget::NextTurn,
            start: 0,
            removed: 1,
            inserted: vec![m],
            canceled: true,
        };
        assert!(inbox.check(&replace).is_ok());
    }

    #[test]
    fn bad_ranges_and_roles_are_refused() {
        let inbox = Inbox::new();
        let past = InboxSpliced {
            target: InboxTarget::NextStep,
            start: 0,
            removed: 1,
            inserted: Vec::new(),
            canceled: true,
        };
        assert!(inbox.check(&past).is_err());
        let mut assistant = msg("x");
        assistant.role = Role::Assistant;
        assert!(
            inbox
                .check(&inbox.append_splice(InboxTarget::NextTurn, assistant))
                .is_err()
        );
    }

    #[test]
    fn clearing_cancels_step_input_first_and_replay_rebuilds_the_lists() {
        let mut inbox = Inbox::new();
        let mut events = Vec::new();
        for (t, text) in [
            (InboxTarget::NextTurn, "a"),
            (InboxTarget::NextStep, "b"),
            (InboxTarget::NextTurn, "c"),
        ] {
            let s = inbox.append_splice(t, msg(text));
            events.push(Event::new(events.len() as u64, 0, s.clone()));
            apply(&mut inbox, s);
        }
        assert_eq!(Inbox::replay(&events).unwrap(), inbox);
        let clears = inbox.clear_splices();
        assert_eq!(
            clears.iter().map(|s| s.target).collect::<Vec<_>>(),
            [InboxTarget::NextStep, InboxTarget::NextTurn]
        );
        assert!(clears.iter().all(|s| s.canceled));
        for s in clears {
            events.push(Event::new(events.len() as u64, 0, s.clone()));
            apply(&mut inbox, s);
        }
        assert!(!inbox.has_pending());
        assert_eq!(Inbox::replay(&events).unwrap(), inbox);
    }

    #[test]
    fn replay_names_the_seq_of_a_splice_that_does_not_apply() {
        let bad = InboxSpliced {
            target: InboxTarget::NextTurn,
            start: 3,
            removed: 0,
            inserted: vec![msg("x")],
            canceled: false,
        };
        let (seq, _) = Inbox::replay(&[Event::new(7, 0, bad)]).unwrap_err();
        assert_eq!(seq, 7);
    }
}
