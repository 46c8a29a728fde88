//! Wake-ups for the mailbox: every post and every take is followed by a `NOTIFY` on one channel,
//! and a store that someone watches keeps a connection that `LISTEN`s to it, so a host learns of
//! new mail, and a sender of its mail's taking, within a round trip instead of a poll.
//!
//! A wake-up says only that the mailbox may have changed: the watcher looks again, so a wake-up
//! too many costs one query, and correctness never depends on one arriving. Notifications sent
//! while the listener is reconnecting are lost, so every (re)subscription is followed by a
//! wake-up of its own, and watchers poll slowly as well. A server that refuses `LISTEN` (an engine
//! that speaks PostgreSQL's protocol without it, or a transaction-pooling proxy in between) gets
//! wake-ups on a timer instead: polling, with the same callers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{AsyncMessage, Client, Connection, Socket};

use super::Shared;
use crate::engine::MailWake;

/// The channel every host of a database notifies and listens on.
pub(super) const CHANNEL: &str = "lineage_mail";

/// The notification each post and take sends (one statement, pipelined after the change).
pub(super) const NOTIFY: &str = "NOTIFY lineage_mail";

/// How often the listener proves its connection alive: a half-open connection (a partition, a
/// dead server machine) delivers nothing and errs only when a request goes unanswered.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// How long a reconnection waits after a failed one.
const RECONNECT: Duration = Duration::from_millis(250);

/// The wake-up period of watchers on a server that refused `LISTEN`.
const POLL: Duration = Duration::from_millis(50);

/// The store's watchers and its one listener, started by the first watcher.
#[derive(Default)]
pub(super) struct Listener {
    wakes: Arc<Mutex<Vec<MailWake>>>,
    started: AtomicBool,
}

impl Listener {
    /// Adds `wake`, starting the listener on the engine's runtime if it is the first.
    pub fn watch(&self, shared: &Arc<Shared>, wake: MailWake) {
        self.wakes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(wake);
        if !self.started.swap(true, Ordering::AcqRel) {
            let wakes = self.wakes.clone();
            shared
                .runtime
                .handle
                .spawn(listen(Arc::downgrade(shared), wakes));
        }
    }
}

/// Calls every watcher; a watcher that panics is reported, and the others are still called.
fn wake_all(wakes: &Mutex<Vec<MailWake>>) {
    let wakes = wakes.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for wake in wakes {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wake())).is_err() {
            tracing::error!("a mailbox watcher panicked");
        }
    }
}

/// Listens until the engine is dropped (its runtime stops, and this task with it): connect,
/// `LISTEN`, wake everyone (anything sent before is unseen), then wake everyone at each
/// notification until the connection fails, and again.
async fn listen(shared: Weak<Shared>, wakes: Arc<Mutex<Vec<MailWake>>>) {
    loop {
        let Some(connecting) = shared.upgrade().map(|s| s.connect_raw()) else {
            return;
        };
        // With the store's connection settings and bound: a black-holed server never answers.
        match connecting.await {
            Ok((client, connection)) => listen_on(&client, connection, &wakes).await,
            Err(error) => tracing::debug!(%error, "the mailbox listener cannot connect"),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// Listens on one connection until it fails or stops answering.
async fn listen_on(
    client: &Client,
    mut connection: Connection<Socket, NoTlsStream>,
    wakes: &Mutex<Vec<MailWake>>,
) {
    // The connection's messages (notifications among them) come only while it is polled, and
    // the client's requests are answered only then too.
    let notifications = async {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(_)) => wake_all(wakes),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "the mailbox listener's connection failed");
                    return;
                }
            }
        }
    };
    let subscribed = async {
        if let Err(error) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
            if error.as_db_error().is_some() {
                // The server answered, and will not: wake the watchers on a timer instead.
                tracing::warn!(%error, "the server refuses LISTEN; the mailbox is polled");
                loop {
                    wake_all(wakes);
                    tokio::time::sleep(POLL).await;
                }
            }
            return;
        }
        wake_all(wakes);
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            let answered = tokio::time::timeout(HEARTBEAT * 2, client.simple_query("")).await;
            if !matches!(answered, Ok(Ok(_))) {
                return;
            }
        }
    };
    tokio::select! {
        () = notifications => {}
        () = subscribed => {}
    }
}
