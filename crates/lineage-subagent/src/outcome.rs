//! How a child's work ended, decided in one place: the turn-end reason its log records, the stop
//! reason its parent is given, and the first line of the settlement notice a continuable child's
//! parent reads. One-shot results and continuable epochs both go through [`ending`], so the two
//! kinds of children can never disagree about what a turn end means.

use lineage_log::{
    ContentBlock, Event, EventBody, Message, MessageId, MessageSource, Role, SessionId,
    TurnEndReason,
};

use crate::StopReason;

/// What ended a child's work, as its log records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The model finished.
    Completed,
    /// Someone cancelled the turn (the user, the parent, a disposal), or pending work was
    /// discarded before it ran.
    Aborted,
    /// Crash repair closed the turn: the process stopped under it.
    Interrupted,
    /// A hook or policy refused the turn.
    Blocked,
    /// The turn failed.
    Error,
    /// The model ran out of output tokens.
    MaxTokens,
    /// A budget reached a limit.
    Budget,
}

impl Ending {
    /// The ending a turn-end reason records.
    pub(crate) fn of(reason: &TurnEndReason) -> Self {
        match reason {
            TurnEndReason::Completed => Ending::Completed,
            TurnEndReason::Aborted { .. } => Ending::Aborted,
            TurnEndReason::Interrupted => Ending::Interrupted,
            TurnEndReason::Blocked => Ending::Blocked,
            TurnEndReason::Error(_) => Ending::Error,
            TurnEndReason::MaxTokens => Ending::MaxTokens,
            TurnEndReason::Budget(_) => Ending::Budget,
            // A reason added to the log after this build: not known to be a success (a one-shot
            // result's diagnostic names it).
            _ => Ending::Error,
        }
    }

    /// The stop reason a parent is given.
    ///
    /// `interrupted` is decided here, once: it is written only by crash repair, so the child did
    /// not fail, its process stopped under it. Like a cancellation, its work was stopped from
    /// outside before it finished and a follow-up or a retry may take it up again, so it is
    /// `aborted` for one-shot and continuable children alike, and a one-shot result's diagnostic
    /// says that a crash stopped it.
    pub(crate) fn stop_reason(self) -> StopReason {
        match self {
            Ending::Completed => StopReason::Completed,
            Ending::Aborted | Ending::Interrupted => StopReason::Aborted,
            Ending::Blocked => StopReason::Refusal,
            Ending::Error => StopReason::Error,
            Ending::MaxTokens => StopReason::MaxTokens,
            Ending::Budget => StopReason::Budget,
        }
    }
}

/// The ending of the last turn in `own` (the events one run or one epoch of a child wrote) that
/// did work: one that ran a step, or that claimed input and ended other than `completed`. A
/// discard of pending input that never ran, with no such turn after it, counts as `aborted`.
/// `None` when no turn did work.
pub(crate) fn ending(own: &[Event]) -> Option<Ending> {
    let mut open: Option<(bool, bool)> = None; // (stepped, claimed)
    let mut end: Option<Ending> = None;
    let mut dropped_unrun = false;
    for event in own {
        match &event.body {
            EventBody::TurnStart(_) => open = Some((false, false)),
            EventBody::StepStart(_) => {
                if let Some(turn) = &mut open {
                    turn.0 = true;
                }
            }
            EventBody::InboxSpliced(splice) if splice.removed > 0 => {
                if splice.canceled {
                    dropped_unrun |= splice.inserted.is_empty();
                } else if let Some(turn) = &mut open {
                    turn.1 = true;
                }
            }
            EventBody::TurnEnd(turn_end) => {
                if let Some((stepped, claimed)) = open.take()
                    && (stepped || (claimed && turn_end.reason != TurnEndReason::Completed))
                {
                    end = Some(Ending::of(&turn_end.reason));
                    dropped_unrun = false;
                }
            }
            _ => {}
        }
    }
    match end {
        Some(Ending::Completed) | None if dropped_unrun => Some(Ending::Aborted),
        end => end,
    }
}

/// How an epoch of a continuable child ended: its [`ending`], `completed` when no turn did work
/// (a child woken for nothing did nothing wrong).
pub(crate) fn epoch_stop_reason(own: &[Event]) -> StopReason {
    ending(own).map_or(StopReason::Completed, Ending::stop_reason)
}

/// How a one-shot run ended: the ending of its last turn (a one-shot run works in every turn it
/// opens) and, for an end a parent should be told more about, a diagnostic. A run that finished
/// no turn failed: it was asked for a result and gave none.
pub(crate) fn run_outcome(own: &[Event]) -> (StopReason, Option<String>) {
    let last = own.iter().rev().find_map(|e| match &e.body {
        EventBody::TurnEnd(end) => Some(&end.reason),
        _ => None,
    });
    let Some(reason) = last else {
        return (
            StopReason::Error,
            Some("the child ended without finishing a turn".into()),
        );
    };
    let diagnostic = match reason {
        TurnEndReason::Error(error) => Some(format!("{}: {}", error.code, error.message)),
        TurnEndReason::Interrupted => {
            Some("the child's turn was stopped by a crash of its process".into())
        }
        TurnEndReason::Budget(reached) => Some(reached.to_string()),
        TurnEndReason::Completed
        | TurnEndReason::Aborted { .. }
        | TurnEndReason::Blocked
        | TurnEndReason::MaxTokens => None,
        other => Some(format!(
            "the child's turn ended for a reason this build does not know: {other:?}"
        )),
    };
    (Ending::of(reason).stop_reason(), diagnostic)
}

/// The closing message of an epoch: the content of its last assistant message that has any,
/// verbatim, tool-call blocks included. Empty when the epoch wrote no such message.
pub(crate) fn closing_message(own: &[Event]) -> Vec<ContentBlock> {
    own.iter()
        .rev()
        .find_map(|e| match &e.body {
            EventBody::AssistantMessage(m) if !m.message.content.is_empty() => {
                Some(m.message.content.clone())
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// A one-shot run's answer: its [`closing_message`] with the tool-call blocks left out (unlike
/// [`lineage_log::final_output`], the whole last message of a session's own suffix).
pub(crate) fn epoch_answer(own: &[Event]) -> Vec<ContentBlock> {
    let mut blocks = closing_message(own);
    blocks.retain(|b| !matches!(b, ContentBlock::ToolCall { .. }));
    blocks
}

/// The most characters a settlement notice's summary has.
pub(crate) const SUMMARY_BOUND: usize = 120;

/// The first line of a settlement notice, which is also its summary: every line fits
/// [`SUMMARY_BOUND`] with the child's full id, an abnormal end's reason being shortened to fit.
pub(crate) fn settlement_summary(child: SessionId, stop: &StopReason) -> String {
    let subject = format!("Background subagent {child}");
    let predicate = match stop {
        StopReason::Completed => "finished; it will do nothing more unless you message it again.",
        StopReason::Aborted => "was stopped before it finished.",
        StopReason::MaxTokens => "ran out of output room before it finished.",
        StopReason::Refusal => "declined the task.",
        StopReason::Budget => "reached its budget before it finished.",
        StopReason::Error => "failed before it finished.",
        StopReason::Other(reason) => {
            let (open, close) = (" ended abnormally (", ") before it finished.");
            let room = SUMMARY_BOUND
                .saturating_sub(subject.chars().count() + open.len() + close.len())
                .max(1);
            // One line: a control character in the reason reads as a space.
            let reason: String = reason
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let reason = if reason.chars().count() <= room {
                reason
            } else {
                let mut cut: String = reason.chars().take(room - 1).collect();
                cut.push('…');
                cut
            };
            return format!("{subject}{open}{reason}{close}");
        }
    };
    format!("{subject} {predicate}")
}

/// The first line of the notice of a continuable child whose turn a crash tore (see
/// `continuation::recovery`): nobody settled it, its process stopped under it.
pub(crate) fn crash_summary(child: SessionId) -> String {
    format!("Background subagent {child} was stopped by a crash before it finished.")
}

/// `summary` cut to [`SUMMARY_BOUND`] characters, ending in an ellipsis when cut.
pub(crate) fn bound_summary(summary: &str) -> String {
    if summary.chars().count() <= SUMMARY_BOUND {
        return summary.to_owned();
    }
    let mut cut: String = summary.chars().take(SUMMARY_BOUND - 1).collect();
    cut.push('…');
    cut
}

/// The settlement notice `id` of `child` for its parent: `summary` as its first line, then
/// the child's closing message `closing` (or that it left none).
pub(crate) fn settlement_notice(
    id: MessageId,
    child: SessionId,
    summary: String,
    closing: &[ContentBlock],
) -> Message {
    let mut content = vec![ContentBlock::text(summary.clone())];
    if closing.is_empty() {
        content.push(ContentBlock::text("It left no closing message."));
    } else {
        content.push(ContentBlock::text("Its closing message:"));
        content.extend(closing.iter().cloned());
    }
    Message {
        id,
        role: Role::User,
        content,
        source: MessageSource::SubagentSettled {
            sender: child,
            summary: bound_summary(&summary).into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use lineage_log::{AbortCause, TurnError};
    use lineage_testkit::ev;

    use super::*;

    /// The one table: every turn-end reason, the stop reason both kinds of children give for
    /// it, and the notice line a continuable child's parent reads.
    #[test]
    fn every_turn_end_reason_has_one_stop_reason_and_one_notice_line() {
        let error = TurnEndReason::Error(Box::new(TurnError {
            message: "the endpoint is overloaded".into(),
            code: "SERVER".into(),
            status: Some(503),
            retry_after_ms: None,
            request_id: None,
        }));
        let table = [
            (
                TurnEndReason::Completed,
                StopReason::Completed,
                "finished; it will do nothing more unless you message it again.",
            ),
            (
                TurnEndReason::Aborted {
                    cause: AbortCause::User,
                },
                StopReason::Aborted,
                "was stopped before it finished.",
            ),
            (
                TurnEndReason::Interrupted,
                StopReason::Aborted,
                "was stopped before it finished.",
            ),
            (
                TurnEndReason::Blocked,
                StopReason::Refusal,
                "declined the task.",
            ),
            (error, StopReason::Error, "failed before it finished."),
            (
                TurnEndReason::MaxTokens,
                StopReason::MaxTokens,
                "ran out of output room before it finished.",
            ),
            (
                TurnEndReason::Budget(Box::new(lineage_log::BudgetReached {
                    limit: lineage_log::BudgetLimit::Requests,
                    max: 20,
                    owner: SessionId::new(),
                })),
                StopReason::Budget,
                "reached its budget before it finished.",
            ),
        ];
        let child = SessionId::new();
        for (reason, stop, line) in table {
            let own = ev::log([
                ev::turn_start(1),
                ev::step_start(1, 1),
                ev::step_end(1, 1),
                ev::turn_end(1, reason.clone()),
            ]);
            assert_eq!(Ending::of(&reason).stop_reason(), stop, "{reason:?}");
            assert_eq!(epoch_stop_reason(&own), stop, "{reason:?}, continuable");
            assert_eq!(run_outcome(&own).0, stop, "{reason:?}, one-shot");
            assert_eq!(
                settlement_summary(child, &stop),
                format!("Background subagent {child} {line}"),
                "{reason:?}"
            );
        }
    }

    #[test]
    fn every_settlement_summary_is_a_whole_line_within_its_bound_with_a_full_id() {
        let child = SessionId::new();
        let long = "a reason far too long to fit on the first line of a notice ".repeat(4);
        for stop in [
            StopReason::Completed,
            StopReason::Aborted,
            StopReason::MaxTokens,
            StopReason::Refusal,
            StopReason::Error,
            StopReason::Budget,
            StopReason::Other("quota".into()),
            StopReason::Other("two\nlines".into()),
            StopReason::Other(long.as_str().into()),
        ] {
            let line = settlement_summary(child, &stop);
            assert!(line.contains(&child.to_string()), "{line}");
            assert!(line.chars().count() <= SUMMARY_BOUND, "{stop:?}: {line}");
            assert_eq!(bound_summary(&line), line, "{stop:?} needs no cut");
            assert!(!line.contains('\n'), "{line}");
        }
        let other = settlement_summary(child, &StopReason::Other(long.as_str().into()));
        assert!(other.ends_with("…) before it finished."), "{other}");
    }
}
