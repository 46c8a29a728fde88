//! Cross-host acceptance: how long a follow-up from a parent live on one host takes to be accepted
//! by the host that keeps its child resident, through a PostgreSQL store's mailbox (posted, the
//! resident host woken, the message claimed, written into the child's inbox and flushed, the mail
//! taken out, the sender woken). Measured with the hosts woken by `LISTEN`/`NOTIFY` and, as the
//! baseline in the same run, by polling alone (`StoreOptions::mail_push` off).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lineage_agent::{Cancellation, CreateAgent, Response};
use lineage_log::{ContentBlock, MessageSource};
use lineage_store::{Store, StoreOptions};
use lineage_subagent::Host;
use lineage_testkit::subagent::{PARENT, Router, continuable, parent_spec};

/// Acceptance latencies of one way of waking the hosts.
#[derive(Clone, Copy, Debug)]
pub struct Acceptance {
    pub median: Duration,
    pub p90: Duration,
}

/// Sends `follow_ups` follow-ups, one at a time, from a parent on one host to its child resident
/// on another (on the database at `url`, which this fills), each timed from the call to its
/// acceptance.
pub fn measure(url: &str, mail_push: bool, follow_ups: usize) -> Acceptance {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let router = Arc::new(Router::default());
        router.script(PARENT, (0..4).map(|_| Response::text("noted")));
        // The child's turn never ends, so it stays resident and takes every follow-up into
        // its inbox.
        router.script("busy", [Response::hang()]);
        let host = || {
            let options = StoreOptions {
                mail_push,
                ..StoreOptions::default()
            };
            let store = Store::open_with(url, options).expect("the database opens");
            Host::new(store, router.clone()).expect("the host starts")
        };

        let keeper = host();
        let lead = keeper
            .agents
            .create(CreateAgent::fresh(parent_spec(vec![])))
            .await
            .expect("the lead");
        let child = keeper
            .subagents
            .start_continuable("spawn", continuable(&lead, "busy", "first job"))
            .await
            .expect("the child starts")
            .child;
        // The lead moves to the other host; the child stays resident with the keeper.
        let lead_id = lead.id();
        keeper.agents.dispose(lead_id).await;
        drop(lead);
        let sender = host();
        let lead = sender
            .agents
            .resume(lead_id, parent_spec(vec![]))
            .await
            .expect("the lead resumes on the other host");

        let mut samples = Vec::with_capacity(follow_ups);
        for n in 0..follow_ups {
            let sent = Instant::now();
            sender
                .subagents
                .followup(
                    &lead,
                    child,
                    vec![ContentBlock::text(format!("follow-up {n}"))],
                    MessageSource::Coordinator { sender: lead_id },
                    &Cancellation::new(),
                )
                .await
                .expect("the follow-up is accepted");
            samples.push(sent.elapsed());
        }
        sender.close().await.expect("the sender closes");
        keeper.close().await.expect("the keeper closes");
        samples.sort();
        Acceptance {
            median: samples[samples.len() / 2],
            p90: samples[samples.len() * 9 / 10],
        }
    })
}
