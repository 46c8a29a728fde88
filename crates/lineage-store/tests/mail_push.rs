//! Wake-ups for the mailbox of a shared store: a host watching the mailbox is woken when another
//! host posts mail or takes it out (PostgreSQL's `LISTEN`/`NOTIFY`), also after its listening
//! connection was cut, and a store with pushes turned off says so (its watchers poll).
//!
//! Nothing here polls: a wake-up that does not come fails the test at its deadline.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use lineage_store::{Mail, Store, StoreOptions};
use lineage_testkit::postgres::postgres;

/// How long a wake-up may take before the test fails: far above a loopback round trip, so it
/// fails only when none comes.
const WAKE_DEADLINE: Duration = Duration::from_secs(20);

/// Watches `store`'s mailbox; each wake-up arrives on the receiver.
fn watch(store: &Store) -> mpsc::Receiver<()> {
    let (woken, wakes) = mpsc::channel();
    assert!(
        store.watch_mail(move || {
            let _ = woken.send(());
        }),
        "a PostgreSQL store pushes mailbox changes by default"
    );
    wakes
}

/// Waits for the next wake-up, then lets the burst it belongs to pass.
fn next_wake(wakes: &mpsc::Receiver<()>, what: &str) {
    wakes
        .recv_timeout(WAKE_DEADLINE)
        .unwrap_or_else(|_| panic!("no wake-up within {WAKE_DEADLINE:?} after {what}"));
    while wakes.try_recv().is_ok() {}
}

fn mail_for(recipient: lineage_log::SessionId) -> Mail {
    Mail {
        id: uuid::Uuid::now_v7(),
        recipient,
        sender: recipient,
        body: b"hello".to_vec(),
    }
}

#[test]
fn a_watching_host_is_woken_by_another_hosts_post_and_take() {
    let url = postgres().create_database();
    let (resident, sender) = (Store::open(&url).unwrap(), Store::open(&url).unwrap());
    let (id, header) = fresh();
    sender.import(header, &completed_turns(1)).unwrap();
    let resident_wakes = watch(&resident);
    let sender_wakes = watch(&sender);
    // Each listener wakes its watchers once it listens (anything sent before went unseen).
    next_wake(&resident_wakes, "the listener started");
    next_wake(&sender_wakes, "the listener started");

    let mail = mail_for(id);
    assert!(sender.post(&mail).unwrap());
    next_wake(&resident_wakes, "another host posted mail");
    assert_eq!(resident.mail_for(&[id]).unwrap(), vec![mail.clone()]);

    while sender_wakes.try_recv().is_ok() {}
    assert_eq!(resident.take_mail(&[mail.id]).unwrap(), vec![mail.id]);
    next_wake(&sender_wakes, "another host took the mail out");
    assert!(sender.mail_for(&[id]).unwrap().is_empty());
}

#[test]
fn a_listener_whose_connection_was_cut_listens_again_and_wakes_its_watchers() {
    let url = postgres().create_database();
    let (resident, sender) = (Store::open(&url).unwrap(), Store::open(&url).unwrap());
    let (id, header) = fresh();
    sender.import(header, &completed_turns(1)).unwrap();
    let wakes = watch(&resident);
    next_wake(&wakes, "the listener started");

    // The server ends every connection to the database, the listener's among them.
    postgres().psql(
        &url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    next_wake(
        &wakes,
        "the listener's connection was cut (it listens again)",
    );

    assert!(sender.post(&mail_for(id)).unwrap());
    next_wake(&wakes, "another host posted mail after the cut");
}

#[test]
fn a_store_with_pushes_turned_off_tells_its_watchers_to_poll() {
    let url = postgres().create_database();
    let polled = StoreOptions {
        mail_push: false,
        ..StoreOptions::default()
    };
    let store = Store::open_with(&url, polled).unwrap();
    assert!(!store.watch_mail(|| {}));
    let file = tempfile::tempdir().unwrap();
    let embedded = Store::open(file.path().join("store.redb")).unwrap();
    assert!(
        !embedded.watch_mail(|| {}),
        "an embedded file has no other hosts to hear from"
    );
}
