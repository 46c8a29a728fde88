//! Host code (a model adapter, a hook) runs inside the turn loop. A panic there must end the turn,
//! not the driver: these helpers turn a panic into its message, in a call, in every poll of a
//! future or a stream, and in the drop of what they wrap.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;

/// The message a panic carried: its `&str` or `String` payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Runs `f`, turning a panic into its message.
///
/// Unwind safety is asserted: what `f` touches is either dropped with it (the host object that
/// panicked is never used again) or runtime state whose every critical section leaves it valid.
pub(crate) fn call<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| panic_message(&*payload))
}

/// A future or stream whose polls and drop cannot panic: a panic in a poll is its message, after
/// which the inner value is dropped (its own drop contained too) and never polled again.
pub(crate) struct Contained<T> {
    inner: Option<T>,
    /// What the inner value is, for the log line of a panic in its drop.
    what: &'static str,
}

impl<T> Contained<T> {
    pub(crate) fn new(inner: T, what: &'static str) -> Self {
        Contained {
            inner: Some(inner),
            what,
        }
    }

    /// Runs `f` over the inner value. `None` once a poll has panicked; a panic drops the value.
    fn with<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> Option<Result<R, String>> {
        let inner = self.inner.as_mut()?;
        let result = call(|| f(inner));
        if result.is_err() {
            self.discard();
        }
        Some(result)
    }

    fn discard(&mut self) {
        if let Some(inner) = self.inner.take()
            && let Err(message) = call(|| drop(inner))
        {
            tracing::warn!(what = self.what, %message, "a panic while dropping was contained");
        }
    }
}

impl<T> Drop for Contained<T> {
    fn drop(&mut self) {
        self.discard();
    }
}

impl<F: Future + Unpin> Future for Contained<F> {
    /// The future's output, or the message of the panic that stopped it.
    type Output = Result<F::Output, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut().with(|f| Pin::new(f).poll(cx)) {
            Some(Ok(Poll::Pending)) => Poll::Pending,
            Some(Ok(Poll::Ready(output))) => Poll::Ready(Ok(output)),
            Some(Err(message)) => Poll::Ready(Err(message)),
            None => Poll::Ready(Err("polled again after it panicked".to_owned())),
        }
    }
}

impl<S: Stream + Unpin> Contained<S> {
    /// The stream's next item, or the message of the panic that stopped it. Ends (`Ok(None)`)
    /// once a poll has panicked.
    pub(crate) async fn next(&mut self) -> Result<Option<S::Item>, String> {
        poll_fn(|cx| match self.with(|s| Pin::new(s).poll_next(cx)) {
            Some(Ok(Poll::Pending)) => Poll::Pending,
            Some(Ok(Poll::Ready(item))) => Poll::Ready(Ok(item)),
            Some(Err(message)) => Poll::Ready(Err(message)),
            None => Poll::Ready(Ok(None)),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Boom;

    impl Future for Boom {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            panic!("boom {}", 1)
        }
    }

    #[test]
    fn a_call_or_a_poll_that_panics_gives_its_message() {
        assert_eq!(call(|| 7), Ok(7));
        assert_eq!(
            call(|| -> () { panic!("static") }),
            Err("static".to_owned())
        );
        let mut boom = Contained::new(Boom, "a test future");
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert_eq!(
            Pin::new(&mut boom).poll(&mut cx),
            Poll::Ready(Err("boom 1".to_owned()))
        );
        assert!(boom.inner.is_none(), "a panicked future is dropped");
        assert!(matches!(
            Pin::new(&mut boom).poll(&mut cx),
            Poll::Ready(Err(_))
        ));
    }
}
