//! [`Phase`]: one sandbox's flow rules with its state, as a path asks them — judge a request
//! (or a connection, a query, a message) as a read or a write to its destination, and arm the
//! labels of a destination once the request is let through.

use std::sync::Arc;

use super::{now, now_secs, poisoned, Change, Ledger, Track};
use crate::config::Binding;
use crate::policy::flows::state::{Armed, FlowRefusal};
use crate::policy::flows::{Act, Dest, Flows};
use crate::policy::process::Process;

/// One sandbox's flow rules with its state: what a path asks.
pub struct Phase<'a> {
    /// The rules.
    pub flows: &'a Arc<Flows>,
    /// The sandbox's own track: its waivers, and what no known process armed.
    main: Arc<Track>,
    /// Where this request's labels are armed, and its key (`None`: the sandbox's id;
    /// `id~process`).
    own: (Arc<Track>, Option<String>),
    /// The other tracks a request is judged with (`scope: exec`): its process's, or every
    /// process's when its process is not known.
    others: Vec<Arc<Track>>,
    ledger: &'a Ledger,
    /// The sandbox.
    id: &'a str,
}

/// The track key of `process` under `scope: exec` (its vouched exec, else its executable).
fn process_key(id: &str, process: Option<&Process>) -> Option<String> {
    let p = process?;
    let name = match (&p.vouched, &p.observed) {
        (Some(v), _) => format!("exec:{}", v.exec),
        (None, Some(crate::policy::process::Observed::Seen(s))) => format!("exe:{}", s.exe),
        _ => return None,
    };
    // A key is one segment of an etcd key and of nothing else: no `/`.
    let name = name.replace('%', "%25").replace('/', "%2F");
    Some(format!("{id}~{name}"))
}

/// A judgement: the refusal, if any, and the labels in force when judged (for the record).
pub struct FlowVerdict {
    /// Why a rule refuses the request.
    pub refused: Option<FlowRefusal>,
    /// The armed labels, by name.
    pub labels: Option<String>,
}

impl<'a> Phase<'a> {
    /// The phase of `binding`'s sandbox for a request of `process`, when it has flow rules.
    pub fn of(
        binding: &'a Binding,
        ledger: Option<&'a Ledger>,
        process: Option<&Process>,
    ) -> Option<Phase<'a>> {
        let flows = binding.network.flows.as_ref()?;
        let ledger = ledger?;
        let id = binding.id.as_str();
        let main = ledger.track(id);
        let (own, others) = match (flows.per_exec, process_key(id, process)) {
            (false, _) => ((main.clone(), None), Vec::new()),
            (true, Some(key)) => {
                let t = ledger.track(&key);
                ((t.clone(), Some(key)), vec![t])
            }
            (true, None) => {
                let all = ledger.tracks(id).into_iter().map(|(_, t)| t);
                ((main.clone(), None), all.collect())
            }
        };
        Some(Phase {
            flows,
            main,
            own,
            others,
            ledger,
            id,
        })
    }

    /// What a [`Gate`] watches: the sandbox's main track, the other tracks it judges with.
    pub(in crate::pipeline) fn watched(&self) -> (Arc<Track>, Vec<Arc<Track>>) {
        (self.main.clone(), self.others.clone())
    }

    /// The armed labels of the other tracks this request is judged with (not the main's).
    fn extra(&self) -> Vec<Armed> {
        self.others
            .iter()
            .filter(|t| !Arc::ptr_eq(t, &self.main))
            .flat_map(|t| t.labels().armed)
            .collect()
    }

    /// Judge `act` to `d`; a `once` waiver it spends is kept before this returns (a
    /// restart cannot give it again).
    pub async fn judge(&self, d: &Dest<'_>, act: Act) -> FlowVerdict {
        let now = now_secs();
        let extra = self.extra();
        let (refused, labels, spent) = match self.main.labels.lock() {
            Ok(mut l) => {
                let before = l.waivers.clone();
                let own = l.armed.len();
                l.armed.extend(extra);
                let refused = l.judge(self.flows, d, act, now).err();
                let names = l.names();
                l.armed.truncate(own);
                let spent: Vec<String> = before
                    .into_iter()
                    .filter(|w| !l.waivers.contains(w))
                    .map(|w| w.label)
                    .collect();
                (refused, names, spent)
            }
            Err(_) => {
                let refused = FlowRefusal {
                    rule: "state".into(),
                    label: "?".into(),
                    detail: "the sandbox's flow state cannot be read".into(),
                };
                return FlowVerdict {
                    refused: Some(refused),
                    labels: None,
                };
            }
        };
        if !spent.is_empty() {
            self.main.changed.send_replace(());
            if let Err(e) = self.ledger.keep().await {
                tracing::warn!(error = %e, "cannot keep the flow state (a spent waiver)");
            }
            for label in spent {
                self.ledger.send(self.id, Change::Unwaived(label)).await;
            }
        }
        FlowVerdict {
            refused: refused.map(|r| self.asking(r)),
            labels,
        }
    }

    /// The refusal with where to ask: a person may waive the label.
    fn asking(&self, mut r: FlowRefusal) -> FlowRefusal {
        r.detail = format!(
            "{}; a person may waive it (egress-proxy flows waive {} {} --once)",
            r.detail, self.id, r.label
        );
        r
    }

    /// Judge `act` to `d` honouring the waivers in force without spending one (a DNS query:
    /// the name of a request a `once` waiver lets through must resolve, and the request
    /// spends it).
    pub fn judge_unspent(&self, d: &Dest<'_>, act: Act) -> FlowVerdict {
        let now = now_secs();
        let mut labels = self.main.labels();
        labels.armed.extend(self.extra());
        let refused = labels.judge(self.flows, d, act, now).err();
        FlowVerdict {
            refused: refused.map(|r| self.asking(r)),
            labels: labels.names(),
        }
    }

    /// Arm the labels `d` is (or may be) in, naming `by` (conn `conn`): the names newly
    /// armed, kept before this returns (`Err`: they could not be kept — the caller refuses
    /// the request rather than let a label go unrecorded).
    pub async fn arm(
        &self,
        d: &Dest<'_>,
        by: impl FnOnce() -> String,
        conn: u64,
    ) -> std::io::Result<Option<String>> {
        let set = self.flows.arms(d);
        if set == 0 {
            return Ok(None);
        }
        let new: Vec<Armed> = match self.own.0.labels.lock() {
            // Already armed (the common case): nothing to name, time or keep.
            Ok(l) if l.armed_all(self.flows, set) => return Ok(None),
            Ok(mut l) => {
                let before = l.armed.len();
                let (_, at) = now();
                l.arm(self.flows, set, &by(), conn, &at);
                l.armed[before..].to_vec()
            }
            Err(_) => return Err(poisoned()),
        };
        if new.is_empty() {
            return Ok(None);
        }
        // The main track's signal too: every watcher of the sandbox re-judges.
        self.own.0.changed.send_replace(());
        self.main.changed.send_replace(());
        self.ledger.keep().await?;
        let names: Vec<&str> = new.iter().map(|a| a.label.as_str()).collect();
        let names = names.join(",");
        for a in new {
            let key = self.own.1.as_deref().unwrap_or(self.id);
            self.ledger.send(key, Change::Armed(a)).await;
        }
        Ok(Some(names))
    }
}
