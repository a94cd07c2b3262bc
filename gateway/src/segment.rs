//! One provider's segment of a response: opening its job stream (or the node's own
//! provider in-process), warming a standby, and racing two (gold's hedged start).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sharemesh_ledger::Ledger;
use sharemesh_mesh::orderbook::BookEntry;
use sharemesh_mesh::MeshHandle;
use sharemesh_protocol::{JobRequest, Keypair, NodeId};
use tokio::sync::mpsc;

use crate::buyer::{start_job, Billing, BuyerStream, JobEvent, SegmentError, StreamTerms};
use crate::vocab::Counted;

/// This process's own provider, as the gateway sees it: a job runs there without a
/// stream (a node cannot dial itself) and yields the same events a remote provider's
/// stream does. The node wires its provider in (`Dispatcher::set_local_route`); the
/// gateway itself does not link the engine.
pub trait LocalRoute: Send + Sync + 'static {
    /// Runs `job` (addressed to this node); its events arrive on the returned channel,
    /// and dropping it cancels the job.
    fn run(&self, job: JobRequest) -> mpsc::Receiver<JobEvent>;
}

/// Everything needed to open segments: the mesh, the buyer's key, the ledger that books
/// its receipts, the stall timeout, and the node's own provider if it has one.
/// The most a job waits for its provider's answer to this buyer's settlement offer.
const OFFER_BEFORE_JOB: Duration = Duration::from_secs(3);

pub struct Segments {
    pub mesh: MeshHandle,
    pub key: Arc<Keypair>,
    pub ledger: Option<Arc<Ledger>>,
    pub stall_timeout: Duration,
    local: OnceLock<Arc<dyn LocalRoute>>,
    /// On-chain settlement, when this buyer settles on a chain (SPEC §13).
    payer: OnceLock<Arc<sharemesh_settlement::Payer>>,
}

/// Where a segment's events come from: a remote provider's job stream, or the node's
/// own provider in-process.
enum Source {
    Remote(Box<BuyerStream>),
    Local(mpsc::Receiver<JobEvent>),
    /// Nothing more (a hedged twin whose task failed).
    Closed,
}

/// A provider's job stream, with the events already read from it.
pub struct Opened {
    source: Source,
    pending: VecDeque<JobEvent>,
    /// Keeps the connection the stream runs on open through a hole punch.
    _path: Option<sharemesh_mesh::PathHold>,
}

impl Opened {
    fn new(source: Source, first: Option<JobEvent>) -> Self {
        Self {
            source,
            pending: first.into_iter().collect(),
            _path: None,
        }
    }

    /// The stream keeps `hold` (its connection) until it is dropped.
    fn holding(self, hold: sharemesh_mesh::PathHold) -> Self {
        Self {
            _path: Some(hold),
            ..self
        }
    }

    /// The next event: buffered ones first.
    pub async fn next(&mut self) -> Option<JobEvent> {
        match self.pending.pop_front() {
            Some(event) => Some(event),
            None => self.read().await,
        }
    }

    /// The next event from the source itself.
    async fn read(&mut self) -> Option<JobEvent> {
        match &mut self.source {
            Source::Remote(stream) => stream.next().await,
            Source::Local(events) => events.recv().await,
            Source::Closed => None,
        }
    }

    /// What the provider signed so far (remote providers only).
    pub fn transcript(&self) -> Option<&crate::verify::transcript::Transcript> {
        match &self.source {
            Source::Remote(stream) => stream.transcript(),
            Source::Local(_) | Source::Closed => None,
        }
    }

    fn answered(&self) -> bool {
        self.pending
            .iter()
            .any(|e| matches!(e, JobEvent::Token(_) | JobEvent::Finished { .. }))
    }

    fn dead(&self) -> bool {
        matches!(self.source, Source::Closed)
            || self
                .pending
                .iter()
                .any(|e| matches!(e, JobEvent::Failed(_) | JobEvent::Rejected(_)))
    }

    /// Reads (buffering) until the provider answers with a token or an end, or fails.
    async fn until_answer(mut self) -> Self {
        while !self.answered() && !self.dead() {
            match self.read().await {
                Some(event) => self.pending.push_back(event),
                None => self.source = Source::Closed,
            }
        }
        self
    }
}

/// How one segment is paid for and checked.
#[derive(Clone)]
pub struct SegmentTerms {
    pub billing: Billing,
    /// The prompt as the buyer counted it (see [`crate::vocab`]).
    pub counted: Option<Counted>,
}

/// How long a stream to a provider not connected after its advertised addresses were
/// dialled may take to open before the attempt counts as unreachable.
const UNCONNECTED_OPEN: Duration = Duration::from_secs(3);

impl Segments {
    pub fn new(
        mesh: MeshHandle,
        key: Arc<Keypair>,
        ledger: Option<Arc<Ledger>>,
        stall_timeout: Duration,
    ) -> Self {
        Self {
            mesh,
            key,
            ledger,
            stall_timeout,
            local: OnceLock::new(),
            payer: OnceLock::new(),
        }
    }

    /// Routes jobs for this node's own provider to it directly (set once).
    pub fn set_local_route(&self, route: Arc<dyn LocalRoute>) {
        let _ = self.local.set(route);
    }

    /// Settles on chain through `payer` (set once).
    pub fn set_payer(&self, payer: Arc<sharemesh_settlement::Payer>) {
        let _ = self.payer.set(payer);
    }

    pub fn payer(&self) -> Option<&Arc<sharemesh_settlement::Payer>> {
        self.payer.get()
    }

    /// Before the first job with `provider` in this run, offers it this buyer's
    /// settlement binding (a provider that settles on chain serves no buyer without
    /// one). A failed offer is logged: the provider's answer to the job says the rest.
    async fn offer_settlement(&self, provider: NodeId) {
        let Some(payer) = self.payer.get() else {
            return;
        };
        if !payer.needs_offer(&provider) {
            return;
        }
        // A provider that takes the offer's stream and never answers must not hold the
        // job back: past the bound the job goes ahead (an on-chain provider then
        // refuses it `Unfunded`, and the next job offers again).
        match tokio::time::timeout(
            OFFER_BEFORE_JOB,
            crate::settle::offer_to(&self.mesh, payer, provider, None),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::warn!(%err, "settlement offer failed"),
            Err(_) => tracing::warn!(%provider, "settlement offer unanswered; the job goes ahead"),
        }
    }

    fn node_id(&self) -> NodeId {
        self.key.node_id()
    }

    /// Opens `job` on its provider (the in-process one directly). A stream refused or
    /// closed before any answer (a busy provider drops streams it cannot take yet) is
    /// retried briefly; the last reason when it never opened.
    pub async fn open(
        &self,
        entry: &BookEntry,
        job: JobRequest,
        segment: SegmentTerms,
    ) -> Result<Opened, SegmentError> {
        let provider = job.provider;
        let peer = provider
            .peer_id()
            .map_err(|e| SegmentError::Unreachable(format!("provider id {provider}: {e}")))?;
        if provider == self.node_id() {
            let local = self.local.get().ok_or_else(|| {
                SegmentError::Unreachable("this node serves no model itself".into())
            })?;
            let mut stream = local.run(job);
            let first = stream.recv().await;
            return Ok(Opened::new(Source::Local(stream), first));
        }
        if entry.advert.addresses.is_empty() && !self.mesh.is_connected(&peer) {
            // Behind NAT with no relay yet: its next advert says where to reach it.
            return Err(SegmentError::Unreachable(format!(
                "{provider} advertises no address it can be reached at yet"
            )));
        }
        self.mesh
            .dial_advertised(&peer, &entry.advert.addresses)
            .await;
        // Not connected at any advertised address (none, while a provider behind NAT
        // has no relay yet): one try through whatever else the mesh knows, not three —
        // the request waits for its next advert instead (`SegmentError::is_unavailable`).
        let connected = self.mesh.is_connected(&peer);
        let attempts = if connected { 3 } else { 1 };
        // Over a fresh relayed connection, give hole punching its moment: the relayed
        // connection closes once a direct one opens, and would cut this job's stream.
        self.mesh.settle_path(&peer).await;
        let hold = self.mesh.hold_path(peer);
        if connected {
            self.offer_settlement(provider).await;
        }
        let mut last_error = SegmentError::Unreachable("not tried".into());
        for attempt in 1..=attempts {
            let terms = StreamTerms {
                ledger: self.ledger.clone(),
                stall_timeout: self.stall_timeout,
                billing: segment.billing.clone(),
                counted: segment.counted.clone(),
            };
            let starting = start_job(&self.mesh, self.key.clone(), peer, job.clone(), terms);
            let started = if connected {
                starting.await
            } else {
                // Dialling by whatever else the mesh knows (a private address from
                // before its node knew it was behind NAT) must not hold a waiting
                // request for the whole stream timeout.
                tokio::time::timeout(UNCONNECTED_OPEN, starting)
                    .await
                    .unwrap_or_else(|_| {
                        Err(SegmentError::Unreachable(format!(
                            "{provider}: not reachable at its advertised addresses, \
                             and no stream within {UNCONNECTED_OPEN:?}"
                        )))
                    })
            };
            match started {
                Ok(mut stream) => match stream.next().await {
                    // A provider that answered wrongly is not asked again.
                    Some(JobEvent::Failed(why)) if !why.worth_retrying() => return Err(why),
                    Some(JobEvent::Failed(why)) => last_error = why,
                    first => {
                        let opened = Opened::new(Source::Remote(Box::new(stream)), first);
                        return Ok(opened.holding(hold));
                    }
                },
                Err(err) => last_error = err,
            }
            tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
        }
        Err(last_error)
    }

    /// Warms the next provider in line for a failover: the same job resumed after the
    /// tokens delivered so far and cut at one new token. Its engine keeps the prompt and
    /// those tokens in its KV cache, so a real resume there prefills only the tokens
    /// delivered since (SPEC §10). The token is discarded, dropping the stream cancels
    /// the job, and no receipt is signed for it (unbilled).
    pub async fn warm_standby(&self, entry: Arc<BookEntry>, job: JobRequest) {
        let (provider, resumed) = (job.provider, job.resume.len());
        let unbilled = SegmentTerms {
            billing: Billing::Unbilled,
            counted: None,
        };
        let mut opened = match self.open(&entry, job, unbilled).await {
            Ok(opened) => opened,
            Err(error) => {
                tracing::debug!(%provider, %error, "standby warm-up not opened");
                return;
            }
        };
        while let Some(event) = opened.next().await {
            if !matches!(event, JobEvent::Accepted(_)) {
                break;
            }
        }
        tracing::debug!(%provider, resumed, "standby warmed");
    }
}

/// Reads both segments until one delivers its first token (or finishes); returns which
/// (0 or 1) with its events so far buffered. The other is dropped, which closes its
/// stream and cancels its job. A segment that fails or is rejected first leaves the
/// race to the other. Each side reads in a task of its own, so the loser is stopped
/// between reads and the winner is never interrupted half-way through one (a job
/// stream also writes receipts as it reads).
pub async fn race(a: Opened, b: Opened) -> (usize, Opened) {
    let mut a = tokio::spawn(a.until_answer());
    let mut b = tokio::spawn(b.until_answer());
    let (first, done, other) = tokio::select! {
        done = &mut a => (0, done, b),
        done = &mut b => (1, done, a),
    };
    if let Ok(opened) = done {
        if opened.answered() {
            other.abort();
            return (first, opened);
        }
    }
    let closed = || Opened::new(Source::Closed, None);
    (1 - first, other.await.unwrap_or_else(|_| closed()))
}
