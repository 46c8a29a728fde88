//! One-shot background jobs: a one-shot run its caller does not wait for. The job belongs to the
//! calling agent (its owner), who alone may read or kill it; when it ends, the owner is told
//! with a message at its next turn; when the owner is disposed of, or the runtime drains, its
//! jobs are killed. Jobs live in this process only: a restart forgets them (the children's
//! sessions stay in the store).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use lineage_agent::{Agent, Agents, Cancellation};
use lineage_log::{AbortCause, Message, MessageSource, SessionId, Text};
use tokio::sync::watch;

use crate::{ErrorCode, StopReason, SubagentError, SubagentRun, lock};

/// A background job's id, unique in its runtime: `job-1`, `job-2`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job-{}", self.0)
    }
}

impl std::str::FromStr for JobId {
    type Err = SubagentError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.strip_prefix("job-")
            .and_then(|n| n.parse().ok())
            .map(JobId)
            .ok_or_else(|| {
                SubagentError::new(
                    ErrorCode::InvalidRequest,
                    format!("{s:?} is not a job id (job-N)"),
                )
            })
    }
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// The run completed; its output's text.
    Completed {
        /// The child's final output, as text.
        output: String,
    },
    /// The run was cancelled (`job_kill`, the owner's end, a drain).
    Killed,
    /// The run failed, or its result or disposal did.
    Failed {
        /// Why: the stop reason and the diagnostic, for people.
        detail: String,
    },
}

impl JobOutcome {
    /// The outcome of `run`, once it is disposed of: disposal always happens before it is
    /// returned, and a failed disposal is part of it.
    async fn settle(run: SubagentRun) -> JobOutcome {
        let outcome = match run.result().await {
            Ok(result) => match result.stop_reason {
                StopReason::Completed => JobOutcome::Completed {
                    output: result.text(),
                },
                StopReason::Aborted => JobOutcome::Killed,
                reason => JobOutcome::Failed {
                    detail: match &result.diagnostic {
                        Some(diagnostic) => format!("{reason}; diagnostic: {diagnostic}"),
                        None => reason.to_string(),
                    },
                },
            },
            Err(error) => JobOutcome::Failed {
                detail: error.to_string(),
            },
        };
        match run.dispose().await {
            Ok(()) => outcome,
            Err(error) => {
                let before = match outcome {
                    JobOutcome::Failed { detail } => format!("{detail}; "),
                    _ => String::new(),
                };
                JobOutcome::Failed {
                    detail: format!("{before}dispose failed: {error}"),
                }
            }
        }
    }

    /// The outcome in a sentence about `job`, for a model.
    pub fn describe(&self, job: JobId) -> String {
        match self {
            JobOutcome::Completed { output } if output.is_empty() => {
                format!("Background job {job} completed without a written answer.")
            }
            JobOutcome::Completed { output } => {
                format!("Background job {job} completed:\n{output}")
            }
            JobOutcome::Killed => format!("Background job {job} was killed."),
            JobOutcome::Failed { detail } => format!("Background job {job} failed: {detail}"),
        }
    }
}

struct Job {
    owner: SessionId,
    cancel: Cancellation,
    done: watch::Receiver<Option<JobOutcome>>,
    /// Its owner was disposed of: nobody can ask for it any more, so it is forgotten once it
    /// has ended (until then a drain still waits for it).
    orphaned: bool,
}

type JobTable = Mutex<HashMap<JobId, Job>>;

/// The jobs of one runtime.
#[derive(Default)]
pub(crate) struct Jobs {
    inner: Arc<JobTable>,
    next: AtomicU64,
    /// Set once the watcher of owners' disposals runs (started with the first job, inside the
    /// runtime that job runs on).
    watching: OnceLock<()>,
}

impl Jobs {
    /// Makes `run`, started for `owner` with `cancel` as its cancellation, a job: settled on a
    /// task of its own, the outcome kept and told to the owner.
    pub(crate) fn adopt(
        &self,
        agents: &Agents,
        owner: &Arc<Agent>,
        label: Text,
        run: SubagentRun,
        cancel: Cancellation,
    ) -> JobId {
        self.watch_owners(agents);
        let id = JobId(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let (done_tx, done) = watch::channel(None);
        lock(&self.inner).insert(
            id,
            Job {
                owner: owner.id(),
                cancel,
                done,
                orphaned: false,
            },
        );
        let owner = Arc::downgrade(owner);
        let table = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let outcome = JobOutcome::settle(run).await;
            let told = outcome.describe(id);
            // Kept before the owner is told, so a reader woken by the message finds it.
            done_tx.send_replace(Some(outcome));
            if let Some(table) = table.upgrade() {
                let mut table = lock(&table);
                if table.get(&id).is_some_and(|job| job.orphaned) {
                    table.remove(&id);
                }
            }
            if let Some(owner) = owner.upgrade() {
                let source = MessageSource::Plugin {
                    name: "jobs".into(),
                };
                let text = format!("[{label}] {told}");
                if let Err(error) = owner.followup(Message::user_text(text, source)) {
                    tracing::debug!(%error, job = %id, "the job's owner could not be told");
                }
            }
        });
        id
    }

    /// Kills the jobs of owners disposed of, and forgets them once they have ended, for as long
    /// as the runtime lives.
    fn watch_owners(&self, agents: &Agents) {
        self.watching.get_or_init(|| {
            let mut events = agents.subscribe();
            let jobs: Weak<JobTable> = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                while let Some(event) = events.recv().await {
                    let Some(jobs) = jobs.upgrade() else { break };
                    if let lineage_agent::RegistryEvent::Disposed { agent, .. } = event {
                        lock(&jobs).retain(|_, job| {
                            if job.owner != agent {
                                return true;
                            }
                            job.cancel.cancel(AbortCause::Parent);
                            job.orphaned = true;
                            // One still running is removed by its own task when it ends.
                            job.done.borrow().is_none()
                        });
                    }
                }
            });
        });
    }

    fn get(
        &self,
        owner: SessionId,
        id: JobId,
    ) -> Result<(Cancellation, watch::Receiver<Option<JobOutcome>>), SubagentError> {
        match lock(&self.inner).get(&id) {
            Some(job) if job.owner == owner => Ok((job.cancel.clone(), job.done.clone())),
            _ => Err(SubagentError::new(
                ErrorCode::InvalidRequest,
                format!("agent {owner} has no job {id}"),
            )),
        }
    }

    /// The outcome of `owner`'s job `id`: now (`None` while it runs), or with `wait`, once it
    /// ends. Another agent's job is unknown to it.
    pub(crate) async fn output(
        &self,
        owner: SessionId,
        id: JobId,
        wait: bool,
    ) -> Result<Option<JobOutcome>, SubagentError> {
        let (_, mut done) = self.get(owner, id)?;
        if wait {
            let _ = done.wait_for(Option::is_some).await;
        }
        Ok(done.borrow().clone())
    }

    /// Kills `owner`'s job `id` and waits for its end (a job already over keeps its outcome).
    pub(crate) async fn kill(
        &self,
        owner: SessionId,
        id: JobId,
    ) -> Result<JobOutcome, SubagentError> {
        let (cancel, mut done) = self.get(owner, id)?;
        cancel.cancel(AbortCause::Parent);
        let outcome = done
            .wait_for(Option::is_some)
            .await
            .map(|o| o.clone())
            .ok()
            .flatten();
        Ok(outcome.unwrap_or(JobOutcome::Killed))
    }

    /// Whether a job `owner` owns is still running.
    pub(crate) fn running_for(&self, owner: SessionId) -> bool {
        lock(&self.inner)
            .values()
            .any(|j| j.owner == owner && j.done.borrow().is_none())
    }

    /// Kills every job now; the returned future waits for each to end.
    pub(crate) fn kill_all(&self) -> impl Future<Output = ()> + Send + 'static {
        let ends: Vec<_> = lock(&self.inner)
            .values()
            .map(|job| {
                job.cancel.cancel(AbortCause::Parent);
                job.done.clone()
            })
            .collect();
        async move {
            for mut done in ends {
                let _ = done.wait_for(Option::is_some).await;
            }
        }
    }
}
