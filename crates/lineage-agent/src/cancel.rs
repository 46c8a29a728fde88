//! Cancellation with a cause: the first cause wins and every later one is ignored.

use std::sync::{Arc, OnceLock};

use lineage_log::AbortCause;
use tokio::sync::Notify;

/// A cancellation signal that remembers why it fired.
///
/// Clones share one signal. The first [`Cancellation::cancel`] sets the cause for good, so a user's
/// cancel followed by a dispose still reports the user. Each turn gets a fresh signal.
#[derive(Clone, Debug, Default)]
pub struct Cancellation {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    cause: OnceLock<AbortCause>,
    notify: Notify,
}

impl Cancellation {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal with `cause`. Returns whether this call fired it (false if it had already
    /// fired, in which case the first cause stays).
    pub fn cancel(&self, cause: AbortCause) -> bool {
        let fired = self.inner.cause.set(cause).is_ok();
        if fired {
            self.inner.notify.notify_waiters();
        }
        fired
    }

    /// Whether the signal has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cause.get().is_some()
    }

    /// The cause the signal fired with, if it has.
    pub fn cause(&self) -> Option<AbortCause> {
        self.inner.cause.get().cloned()
    }

    /// Resolves with the cause once the signal has fired (at once if it already has).
    pub async fn cancelled(&self) -> AbortCause {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            // Register before checking, so a cancel between the check and the await is not missed.
            notified.as_mut().enable();
            if let Some(cause) = self.inner.cause.get() {
                return cause.clone();
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_cause_wins() {
        let c = Cancellation::new();
        assert!(!c.is_cancelled());
        assert!(c.cancel(AbortCause::User));
        assert!(!c.cancel(AbortCause::Disposed));
        assert_eq!(c.cause(), Some(AbortCause::User));
    }

    #[tokio::test]
    async fn waiters_wake_with_the_cause() {
        let c = Cancellation::new();
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.cancelled().await }
        });
        tokio::task::yield_now().await;
        c.cancel(AbortCause::Parent);
        assert_eq!(waiter.await.unwrap(), AbortCause::Parent);
        // Already fired: resolves at once.
        assert_eq!(c.cancelled().await, AbortCause::Parent);
    }
}
