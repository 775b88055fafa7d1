//! The admission sequence and its verdict point, driven with real policy sets, a real dial to
//! a loopback listener and a real audit log: stages run in order only after the policy
//! allowed, may refuse or hold, and cannot widen what the policy refused.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::audit::accept::Accepted;
use crate::audit::AuditLog;
use crate::audit::{Mode, Sink};
use crate::config::load_str;
use crate::egress::upstream_pool::UpstreamPool;
use crate::egress::verdict::{FirstBytesStage, Judgement, Stage};
use crate::policy::refusal::Refusal;

/// Counts its calls and answers with what it is built with.
struct Probe {
    calls: AtomicUsize,
    answer: fn() -> Judgement,
}

impl Probe {
    fn new(answer: fn() -> Judgement) -> Arc<Self> {
        Arc::new(Probe {
            calls: AtomicUsize::new(0),
            answer,
        })
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Stage for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }
    fn judge(&self, _: &Point<'_>) -> Judgement {
        self.calls.fetch_add(1, Ordering::SeqCst);
        (self.answer)()
    }
}

fn pass() -> Judgement {
    Judgement::Pass
}

fn refuse_host() -> Judgement {
    Judgement::Refuse(Refusal::new(Reason::HostMismatch, "probe refused"))
}

fn refuse_credentials() -> Judgement {
    Judgement::Refuse(Refusal::new(Reason::CredentialMisuse, "probe refused"))
}

fn hold_then_pass() -> Judgement {
    Judgement::Hold {
        answer: Box::pin(async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Judgement::Pass
        }),
        within: Duration::from_secs(5),
        on_timeout: Reason::ConnectionTimeout,
    }
}

fn hold_forever() -> Judgement {
    Judgement::Hold {
        answer: Box::pin(std::future::pending()),
        within: Duration::from_millis(100),
        on_timeout: Reason::ConnectionTimeout,
    }
}

/// A policy set, the handles the sequence reads, a loopback origin and an audit file.
struct World {
    set: PolicySet,
    resolver: Resolver,
    metrics: Metrics,
    limiters: Limiters,
    admissions: Arc<Admissions>,
    answers: DnsMemory,
    upstreams: UpstreamPool,
    origin: std::net::TcpListener,
    sink: Sink,
    _dir: tempfile::TempDir,
}

impl World {
    fn new(enforcement: &str) -> Self {
        let origin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = origin.local_addr().unwrap().port();
        let text = format!(
            "defaults: {{ guard_allow_ranges: [127.0.0.1/32] }}\nsandboxes:\n  - {{ id: a, sources: [127.0.0.0/8], enforcement: {enforcement}, policy: {{ provider: local, config: {{}}, network: {{ egress: [\"127.0.0.1:{port}\"] }} }} }}\n"
        );
        let c = load_str(&text, "t", Path::new("."), None).unwrap();
        let set = PolicySet::compile(&c, &[], vec![]).unwrap();
        let (resolver, _) = Resolver::new(&c.dns);
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(Some(&dir.path().join("a.jsonl")), 1000).unwrap();
        World {
            set,
            resolver,
            metrics: Metrics::new().unwrap(),
            limiters: Limiters::default(),
            admissions: Admissions::new(c.admission),
            answers: DnsMemory::default(),
            upstreams: UpstreamPool::new(c.forward_keepalive),
            origin,
            sink: Sink {
                log: Arc::new(log),
                metrics: Arc::new(Metrics::new().unwrap()),
                denials: Default::default(),
                usage: Default::default(),
            },
            _dir: dir,
        }
    }

    fn port(&self) -> u16 {
        self.origin.local_addr().unwrap().port()
    }

    /// Admit `host:port` through `verdicts`; the result and the guard's record.
    async fn admit(
        &self,
        verdicts: &Verdicts,
        target: &str,
    ) -> (Result<Admitted, Refused>, AuditGuard) {
        let cx = Cx {
            set: &self.set,
            resolver: &self.resolver,
            metrics: &self.metrics,
            limiters: &self.limiters,
            admissions: &self.admissions,
            answers: &self.answers,
            upstreams: &self.upstreams,
            verdicts,
            default_sandbox: None,
            parent: None,
            connect_timeout: Duration::from_secs(2),
            observer: None,
        };
        let accepted = Accepted {
            conn_id: 1,
            client: "127.0.0.1:40000".parse().unwrap(),
            started: Instant::now(),
        };
        let mut audit = AuditGuard::new(self.sink.clone(), &accepted, Mode::Connect, "v".into());
        let target = Target::parse(target, None).unwrap();
        let door = Door {
            source: accepted.client.ip(),
            evidence: Evidence::Presented { credentials: None },
            port: target.port,
            peer: None,
        };
        let r = admit(&cx, door, &mut Seated(|| {}), Ask::to(target), &mut audit).await;
        (r, audit)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Every record written before the directory goes.
        self.sink.log.close(Duration::from_secs(5));
    }
}

#[tokio::test]
async fn stages_run_in_order_after_the_policy_allowed_and_a_refusal_stops_the_rest() {
    let w = World::new("enforce");
    let (first, second, third) = (Probe::new(pass), Probe::new(refuse_host), Probe::new(pass));
    let verdicts = Verdicts::new(vec![first.clone(), second.clone(), third.clone()]);
    let (r, _audit) = w.admit(&verdicts, &format!("127.0.0.1:{}", w.port())).await;
    let refused = r.err().expect("the second stage refuses");
    assert_eq!(refused.shown.reason, Reason::HostMismatch);
    assert_eq!(refused.explanation, "probe refused");
    assert_eq!(
        (first.calls(), second.calls(), third.calls()),
        (1, 1, 0),
        "in order, and nothing after a refusal"
    );
    // Nothing was dialled: the origin has no connection waiting.
    w.origin.set_nonblocking(true).unwrap();
    assert!(w.origin.accept().is_err(), "a refused exchange dialled");
}

#[tokio::test]
async fn no_stage_runs_for_what_the_policy_refused_and_none_can_widen_it() {
    let w = World::new("enforce");
    let allow_all = Probe::new(pass);
    let verdicts = Verdicts::new(vec![allow_all.clone()]);
    // Another port of the same address: no rule allows it.
    let other = if w.port() == 1 { 2 } else { w.port() - 1 };
    let (r, _audit) = w.admit(&verdicts, &format!("127.0.0.1:{other}")).await;
    assert!(r.is_err());
    // The guard refuses an address no range opened, before any stage.
    let (r2, _audit) = w.admit(&verdicts, "169.254.169.254:80").await;
    let refused = r2.err().expect("the guard refuses metadata");
    assert_ne!(refused.shown.reason, Reason::RuleMatched);
    assert_eq!(allow_all.calls(), 0, "a stage ran for a refused exchange");
}

#[tokio::test]
async fn all_stages_passing_admit_a_dialled_exchange() {
    let w = World::new("enforce");
    let probe = Probe::new(pass);
    let verdicts = Verdicts::new(vec![Arc::new(FirstBytesStage), probe.clone()]);
    let (r, _audit) = w.admit(&verdicts, &format!("127.0.0.1:{}", w.port())).await;
    let admitted = match r {
        Ok(a) => a,
        Err(refused) => panic!("not admitted: {refused:?}"),
    };
    assert_eq!(probe.calls(), 1);
    assert!(matches!(admitted.route, Route::Dialed(_)));
    assert_eq!(admitted.clearance.target.port, w.port());
    assert!(w.origin.accept().is_ok(), "the checked address was dialled");
}

#[tokio::test]
async fn a_held_exchange_waits_for_its_answer_and_is_refused_past_its_limit() {
    let w = World::new("enforce");
    let held = Probe::new(hold_then_pass);
    let (r, _audit) = w
        .admit(
            &Verdicts::new(vec![held.clone()]),
            &format!("127.0.0.1:{}", w.port()),
        )
        .await;
    assert!(r.is_ok(), "a hold answered with pass admits");

    let silent = Probe::new(hold_forever);
    let after = Probe::new(pass);
    let verdicts = Verdicts::new(vec![silent.clone(), after.clone()]);
    let (r, _audit) = w.admit(&verdicts, &format!("127.0.0.1:{}", w.port())).await;
    let refused = r.err().expect("a hold past its limit refuses");
    assert_eq!(refused.shown.reason, Reason::ConnectionTimeout);
    assert!(
        refused.explanation.contains("probe did not answer"),
        "{}",
        refused.explanation
    );
    assert_eq!(after.calls(), 0);
}

#[tokio::test]
async fn report_mode_lets_a_reportable_refusal_through_and_no_other() {
    let w = World::new("report");
    let target = format!("127.0.0.1:{}", w.port());
    let reportable = Verdicts::new(vec![Probe::new(refuse_host)]);
    let (r, _audit) = w.admit(&reportable, &target).await;
    assert!(r.is_ok(), "host_mismatch is reported, not refused");
    let hard = Verdicts::new(vec![Probe::new(refuse_credentials)]);
    let (r, _audit) = w.admit(&hard, &target).await;
    assert_eq!(
        r.err().expect("credential_misuse refuses").shown.reason,
        Reason::CredentialMisuse
    );
}
