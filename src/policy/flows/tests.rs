//! Flow rules against worked cases and, for random sequences, against a reference model.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::state::{Labels, Waive};
use super::*;

fn member(host: &str, port: Option<u16>, paths: &[&str]) -> Member {
    let requests = (!paths.is_empty()).then(|| {
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        HttpRule::new(host, &[], &paths).unwrap()
    });
    Member {
        host: BoundHost::parse(host).unwrap(),
        port,
        requests,
    }
}

/// `private` (corp hosts, GitHub's acme repos), `untrusted` (outside private) and the issue's
/// three rules.
fn trifecta() -> Flows {
    Flows {
        labels: vec![
            Label {
                name: "private".into(),
                members: vec![
                    member("*.corp.example", None, &[]),
                    member("api.github.com", None, &["/repos/acme/**"]),
                ],
                outside: 0,
            },
            Label {
                name: "untrusted".into(),
                members: vec![],
                outside: 0b01,
            },
        ],
        rules: vec![
            FlowRule {
                name: "no-exfil".into(),
                after: 0b01,
                refuse: Refuse::Writes,
                to: None,
                except: 0b01,
            },
            FlowRule {
                name: "no-private-after-web".into(),
                after: 0b10,
                refuse: Refuse::All,
                to: Some(0b01),
                except: 0,
            },
            FlowRule {
                name: "lockdown".into(),
                after: 0b11,
                refuse: Refuse::Writes,
                to: None,
                except: 0,
            },
        ],
        bounds: Bounds::default(),
        per_exec: false,
    }
}

fn http<'a>(host: &'a str, method: &'a str, path: &'a str) -> Dest<'a> {
    Dest {
        host,
        port: Some(443),
        request: Some((method, path)),
    }
}

fn opaque(host: &str) -> Dest<'_> {
    Dest {
        host,
        port: Some(443),
        request: None,
    }
}

#[test]
fn a_write_after_private_is_refused_except_to_private() {
    let f = trifecta();
    let mut s = Labels::default();
    let post = http("paste.example.net", "POST", "/");
    assert_eq!(s.judge(&f, &post, Act::Write, 0), Ok(()));
    let doc = http("git.corp.example", "GET", "/doc");
    assert_eq!(s.judge(&f, &doc, Act::Read, 0), Ok(()));
    assert!(s.arm(&f, f.arms(&doc), "GET git.corp.example/doc", 7, "T"));
    let r = s.judge(&f, &post, Act::Write, 0).unwrap_err();
    assert_eq!(&*r.rule, "no-exfil");
    assert!(
        r.detail.contains("by GET git.corp.example/doc (conn 7)"),
        "{}",
        r.detail
    );
    // Reads elsewhere, and writes to private, still go.
    assert_eq!(s.judge(&f, &post, Act::Read, 0), Ok(()));
    let push = http("git.corp.example", "POST", "/push");
    assert_eq!(s.judge(&f, &push, Act::Write, 0), Ok(()));
}

#[test]
fn unknown_membership_arms_and_never_exempts() {
    let f = trifecta();
    // An opaque connection to GitHub may be a private repository: it arms private…
    assert_eq!(f.arms(&opaque("api.github.com")) & 0b01, 0b01);
    // …and a public repository's page is untrusted only.
    assert_eq!(f.arms(&http("api.github.com", "GET", "/repos/x/y")), 0b10);
    let mut s = Labels::default();
    s.arm(&f, 0b01, "GET git.corp.example/doc", 1, "T");
    // A write over an opaque connection to GitHub might be to a public repository: refused.
    assert!(s
        .judge(&f, &opaque("api.github.com"), Act::Write, 0)
        .is_err());
    let own = http("api.github.com", "POST", "/repos/acme/app/issues");
    assert_eq!(s.judge(&f, &own, Act::Write, 0), Ok(()));
}

#[test]
fn waivers_once_for_a_time_and_reset() {
    let f = trifecta();
    let mut s = Labels::default();
    let post = http("paste.example.net", "POST", "/");
    s.arm(&f, 0b01, "GET git.corp.example/doc", 1, "T");
    assert!(s.waive("private", Waive::Once, "alice", "T", 0));
    assert_eq!(s.judge(&f, &post, Act::Write, 0), Ok(()));
    assert!(s.judge(&f, &post, Act::Write, 0).is_err(), "once is once");
    assert!(s.waive("private", Waive::Until(100), "alice", "T", 0));
    assert_eq!(s.judge(&f, &post, Act::Write, 99), Ok(()));
    assert!(s.judge(&f, &post, Act::Write, 100).is_err(), "expired");
    assert!(s.waive("private", Waive::Reset, "alice", "T", 0));
    assert_eq!(s.judge(&f, &post, Act::Write, 0), Ok(()));
    assert!(
        !s.waive("untrusted", Waive::Once, "alice", "T", 0),
        "not armed"
    );
}

#[test]
fn what_a_request_does() {
    let b = Bounds::default();
    assert_eq!(
        Act::of_request("GET", false, ("/", Some("q=1")), b),
        Act::Read
    );
    assert_eq!(Act::of_request("GET", true, ("/", None), b), Act::Write);
    assert_eq!(Act::of_request("DELETE", false, ("/", None), b), Act::Write);
    let long = "a".repeat(129);
    assert_eq!(
        Act::of_request("GET", false, ("/", Some(&long)), b),
        Act::Write
    );
    let path = format!("/{}", "p".repeat(256));
    assert_eq!(Act::of_request("GET", false, (&path, None), b), Act::Write);
}

// ---- the reference model: sets of names, written for clarity, not speed ----

const HOSTS: [&str; 4] = [
    "a.corp.example",
    "b.corp.example",
    "web.example",
    "paste.example",
];
const PATHS: [&str; 2] = ["/private/x", "/public/x"];

/// A label as sets: hosts that are members whole, hosts that are members on `/private/**`,
/// and the labels it is the outside of (lower indices only).
#[derive(Debug, Clone)]
struct ModelLabel {
    whole: BTreeSet<usize>,
    private_paths: BTreeSet<usize>,
    outside: BTreeSet<usize>,
}

#[derive(Debug, Clone)]
struct ModelRule {
    after: BTreeSet<usize>,
    all: bool,
    to: Option<BTreeSet<usize>>,
    except: BTreeSet<usize>,
}

/// 0: no, 1: maybe, 2: yes.
fn model_in(labels: &[ModelLabel], l: usize, host: usize, path: Option<usize>) -> u8 {
    let m = &labels[l];
    let mut best = 0;
    if m.whole.contains(&host) {
        best = 2;
    }
    if m.private_paths.contains(&host) {
        best = best.max(match path {
            None => 1,
            Some(0) => 2,
            Some(_) => 0,
        });
    }
    if !m.outside.is_empty() {
        let inside = m
            .outside
            .iter()
            .map(|&o| model_in(labels, o, host, path))
            .max()
            .unwrap_or(0);
        best = best.max(2 - inside);
    }
    best
}

fn model_refused(
    labels: &[ModelLabel],
    rules: &[ModelRule],
    armed: &BTreeSet<usize>,
    (host, path, write): (usize, Option<usize>, bool),
) -> Option<usize> {
    rules.iter().position(|r| {
        !r.after.is_empty()
            && r.after.is_subset(armed)
            && (r.all || write)
            && r.to
                .as_ref()
                .is_none_or(|to| to.iter().any(|&l| model_in(labels, l, host, path) >= 1))
            && !r
                .except
                .iter()
                .any(|&l| model_in(labels, l, host, path) == 2)
    })
}

fn compile(labels: &[ModelLabel], rules: &[ModelRule]) -> Flows {
    let set = |s: &BTreeSet<usize>| s.iter().fold(0u32, |a, &i| a | 1 << i);
    Flows {
        labels: labels
            .iter()
            .enumerate()
            .map(|(i, l)| Label {
                name: format!("l{i}").into(),
                members: l
                    .whole
                    .iter()
                    .map(|&h| member(HOSTS[h], None, &[]))
                    .chain(
                        l.private_paths
                            .iter()
                            .map(|&h| member(HOSTS[h], None, &["/private/**"])),
                    )
                    .collect(),
                outside: set(&l.outside),
            })
            .collect(),
        rules: rules
            .iter()
            .enumerate()
            .map(|(i, r)| FlowRule {
                name: format!("r{i}").into(),
                after: set(&r.after),
                refuse: if r.all { Refuse::All } else { Refuse::Writes },
                to: r.to.as_ref().map(set),
                except: set(&r.except),
            })
            .collect(),
        bounds: Bounds::default(),
        per_exec: false,
    }
}

fn labels_strategy() -> impl Strategy<Value = Vec<ModelLabel>> {
    let hosts = || proptest::collection::btree_set(0..HOSTS.len(), 0..3);
    proptest::collection::vec((hosts(), hosts(), any::<bool>()), 1..4).prop_map(|ls| {
        ls.into_iter()
            .enumerate()
            .map(|(i, (whole, private_paths, out))| ModelLabel {
                whole,
                private_paths,
                // The outside of the label before it, when there is one.
                outside: if out && i > 0 {
                    BTreeSet::from([i - 1])
                } else {
                    BTreeSet::new()
                },
            })
            .collect()
    })
}

fn rules_strategy(n: usize) -> impl Strategy<Value = Vec<ModelRule>> {
    let set = move || proptest::collection::btree_set(0..n, 0..=n.min(2));
    let rule = (set(), any::<bool>(), proptest::option::of(set()), set()).prop_map(
        |(after, all, to, except)| ModelRule {
            after,
            all,
            to,
            except,
        },
    );
    proptest::collection::vec(rule, 0..4)
}

/// Labels, rules and steps (host, path, whether a write).
type Case = (
    Vec<ModelLabel>,
    Vec<ModelRule>,
    Vec<(usize, Option<usize>, bool)>,
);

fn case() -> impl Strategy<Value = Case> {
    labels_strategy().prop_flat_map(|labels| {
        let n = labels.len();
        let step = (
            0..HOSTS.len(),
            proptest::option::of(0..PATHS.len()),
            any::<bool>(),
        );
        (
            Just(labels),
            rules_strategy(n),
            proptest::collection::vec(step, 1..24),
        )
    })
}

proptest! {
    /// Request after request (each allowed one arms the labels of its destination), the
    /// compiled rules refuse exactly what the model refuses, naming the same rule.
    #[test]
    fn decisions_equal_the_reference_model((labels, rules, steps) in case()) {
        let flows = compile(&labels, &rules);
        let mut state = Labels::default();
        let mut armed: BTreeSet<usize> = BTreeSet::new();
        for (host, path, write) in steps {
            let d = Dest {
                host: HOSTS[host],
                port: Some(443),
                request: path.map(|p| (if write { "POST" } else { "GET" }, PATHS[p])),
            };
            let act = if write { Act::Write } else { Act::Read };
            let got = state.judge(&flows, &d, act, 0).err().map(|r| r.rule.to_string());
            let want = model_refused(&labels, &rules, &armed, (host, path, write))
                .map(|i| format!("r{i}"));
            prop_assert_eq!(&got, &want);
            if got.is_none() {
                state.arm(&flows, flows.arms(&d), "req", 1, "T");
                let arms: BTreeMap<usize, u8> = (0..labels.len())
                    .map(|l| (l, model_in(&labels, l, host, path)))
                    .collect();
                armed.extend(arms.into_iter().filter(|&(_, v)| v >= 1).map(|(l, _)| l));
            }
        }
    }
}
