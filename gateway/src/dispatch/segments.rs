//! One provider's segment of a response: opening it (hedged for gold), relaying its
//! events to the client, and warming the next provider in line.

use super::*;

impl Dispatcher {
    /// Gold's hedged start: the same job on the next provider too; the first to answer
    /// serves, the other is cancelled and stays next in line. Returns the winner.
    pub(super) async fn open_hedged(
        &self,
        candidate: Candidate,
        job: JobRequest,
        queue: &mut VecDeque<Candidate>,
        terms: &SegmentTerms,
        since: Instant,
    ) -> (Candidate, Result<Opened, SegmentError>) {
        let job_id = job.job_id;
        let Some(partner) = queue.pop_front() else {
            let opened = self
                .segments
                .open(&candidate.entry, job, terms.clone())
                .await;
            return (candidate, opened);
        };
        self.count(|m| m.hedges.inc());
        let partner_job = JobRequest {
            provider: partner.provider(),
            max_price_per_token: partner.price,
            ..job.clone()
        };
        let (mine, theirs) = futures::future::join(
            self.segments.open(&candidate.entry, job, terms.clone()),
            self.segments
                .open(&partner.entry, partner_job, terms.clone()),
        )
        .await;
        let (winner, loser, opened) = match (mine, theirs) {
            (Ok(a), Ok(b)) => {
                let (winner, loser, opened) = match race(a, b).await {
                    (0, opened) => (candidate, partner, Ok(opened)),
                    (_, opened) => (partner, candidate, Ok(opened)),
                };
                self.log_nothing(job_id, since, &loser, "hedge lost".into());
                (winner, loser, opened)
            }
            (Ok(a), Err(_)) => (candidate, partner, Ok(a)),
            (Err(_), Ok(b)) => (partner, candidate, Ok(b)),
            (Err(err), Err(_)) => (candidate, partner, Err(err)),
        };
        tracing::info!(winner = %winner.provider(), other = %loser.provider(), "hedged start");
        queue.push_front(loser);
        (winner, opened)
    }

    /// Relays one segment's events to the client until it ends or the client goes away
    /// (`client_left`; the stream is dropped on return, which cancels the job).
    pub(super) async fn stream_segment(
        &self,
        mut stream: Opened,
        job: &JobRequest,
        started: Instant,
        response: &mut Response,
        next: Option<&Candidate>,
        events: &mpsc::Sender<DispatchEvent>,
    ) -> SegmentReport {
        let provider = job.provider;
        let mut report = SegmentReport {
            provider,
            accept: None,
            tokens: 0,
            last_receipt: None,
            started,
            first_token: None,
            end: Err(SegmentError::StreamBroke(
                "the job ended without an answer".into(),
            )),
            transcript: None,
            client_left: false,
        };
        while let Some(event) = stream.next().await {
            match event {
                JobEvent::Accepted(accept) => {
                    let first = response.providers.is_empty();
                    response.providers.push(provider);
                    let event = if !first {
                        DispatchEvent::Switched { provider }
                    } else {
                        DispatchEvent::Accepted {
                            job_id: response.job_id,
                            provider,
                            prompt_tokens: accept.prompt_tokens,
                        }
                    };
                    report.accept = Some(accept);
                    if events.send(event).await.is_err() {
                        report.client_left = true;
                        break;
                    }
                }
                JobEvent::Rejected(reject) => {
                    if reject.reason == sharemesh_protocol::RejectReason::Unfunded {
                        // The provider may have lost this buyer's binding (a new data
                        // folder): the next job there offers it again.
                        if let Some(payer) = self.segments.payer() {
                            payer.forget_offer(&provider);
                        }
                    }
                    report.end = Err(SegmentError::Refused {
                        reason: reject.reason,
                        detail: reject.detail,
                    });
                    break;
                }
                JobEvent::Token(chunk) => {
                    report.first_token.get_or_insert_with(Instant::now);
                    report.tokens += chunk.token_ids.len() as u64;
                    let token_id = chunk.token_ids.first().copied().unwrap_or_default();
                    response.delivered.extend(&chunk.token_ids);
                    self.maybe_warm_standby(response, job, next);
                    let text = chunk.text_delta;
                    let logprobs = chunk.logprobs.into_iter().next();
                    let token = DispatchEvent::Token {
                        text,
                        token_id,
                        logprobs,
                    };
                    if events.send(token).await.is_err() {
                        report.client_left = true;
                        break;
                    }
                }
                JobEvent::Receipted(receipt) => report.last_receipt = Some(receipt),
                JobEvent::Finished { finish, .. } => {
                    report.end = Ok(finish);
                    break;
                }
                JobEvent::Failed(why) => {
                    report.end = Err(why);
                    break;
                }
            }
        }
        if report.client_left {
            report.end = Err(SegmentError::StreamBroke("the client went away".into()));
        }
        report.transcript = stream.transcript().cloned();
        report
    }

    /// Every `warm_standby_every` delivered tokens, warms the next provider in line with
    /// the tokens so far (one warm-up at a time).
    pub(super) fn maybe_warm_standby(
        &self,
        response: &mut Response,
        job: &JobRequest,
        next: Option<&Candidate>,
    ) {
        let every = self.defaults.warm_standby_every;
        let idle = response.warming.as_ref().is_none_or(|t| t.is_finished());
        let due = every > 0 && response.delivered.len() >= response.warmed_at + every;
        let Some(next) = next.filter(|_| idle && due) else {
            return;
        };
        let warm_up = JobRequest {
            job_id: JobId::from_bytes(rand::rng().random()),
            provider: next.provider(),
            max_price_per_token: next.price,
            sampling: sharemesh_protocol::Sampling {
                max_tokens: response.delivered.len() as u32 + 1,
                ..job.sampling.clone()
            },
            resume: response.delivered.clone(),
            ..job.clone()
        };
        let (segments, entry) = (self.segments.clone(), next.entry.clone());
        response.warming = Some(tokio::spawn(async move {
            segments.warm_standby(entry, warm_up).await
        }));
        response.warmed_at = response.delivered.len();
    }
}
