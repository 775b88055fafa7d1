//! `policy_decide`: one decision against a 10,000-entry policy (exact, wildcard, glob, CIDR);
//! `policy_compile`: compiling 10,000 sandboxes; `grants`: a set's decision for a name no rule
//! allows, without grants and with the 64 a sandbox may hold (the target granted last, or not
//! at all: the whole list scanned). Also prints per-call decide percentiles
//! (p50/p99/p99.9) measured one call at a time, since the budget (DESIGN §12) is a p99.
//!
//! Run: `cargo bench --bench policy`

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use egress_proxy::config::load_str;
use egress_proxy::policy::entry::parse_entry;
use egress_proxy::policy::guard::Guard;
use egress_proxy::policy::ports::PortSet;
use egress_proxy::policy::target::Target;
use egress_proxy::policy::{CompiledPolicy, Enforcement, Mode, NetworkSpec};
use egress_proxy::sandboxes::set::PolicySet;

/// 10,000 entries: 2,500 each of exact names, `*.` wildcards, globs and CIDRs.
fn big_spec() -> NetworkSpec {
    let mut texts = Vec::with_capacity(10_000);
    for i in 0..2500 {
        texts.push(format!("api{i}.service{}.example.com", i % 97));
        texts.push(format!("*.tenant{i}.example.net"));
        texts.push(format!("build-*.team{i}.example.org"));
        texts.push(format!(
            "{}.{}.{}.0/24:*",
            11 + i % 80,
            (i / 80) % 256,
            i % 256
        ));
    }
    NetworkSpec {
        mode: Mode::Restricted,
        egress: texts
            .into_iter()
            .map(|t| {
                let e = parse_entry(&t).expect("bench entries are valid");
                (t, e)
            })
            .collect(),
        deny: vec![(
            "blocked.tenant7.example.net".to_string(),
            parse_entry("blocked.tenant7.example.net").expect("valid"),
        )],
        resolve_for_address_rules: false,
        http: Default::default(),
        scoped: Vec::new(),
        layers: Default::default(),
        flows: None,
    }
}

fn targets() -> Vec<Target> {
    let mut t = Vec::new();
    for i in (0..2500).step_by(37) {
        for s in [
            format!("api{i}.service{}.example.com:443", i % 97),
            format!("deep.x.tenant{i}.example.net:443"),
            format!("build-42.team{i}.example.org:443"),
            format!("{}.{}.{}.9:5432", 11 + i % 80, (i / 80) % 256, i % 256),
            format!("nothing{i}.example.com:443"),
            "blocked.tenant7.example.net:443".to_string(),
            format!("a.b.c.d.e.f.unknown{i}.example.io:443"),
        ] {
            t.push(Target::parse(&s, None).expect("bench targets are valid"));
        }
    }
    t
}

fn compiled() -> CompiledPolicy {
    CompiledPolicy::compile(
        "big",
        "bench.yaml",
        &big_spec(),
        Enforcement::Enforce,
        &PortSet::from_ports(&[443]).expect("443"),
    )
    .expect("compiles")
}

fn bench_decide(c: &mut Criterion) {
    let p = compiled();
    let guard = Guard::default();
    let targets = targets();
    let mut i = 0;
    c.bench_function("policy_decide", |b| {
        b.iter(|| {
            i = (i + 1) % targets.len();
            black_box(p.decide(black_box(&targets[i]), None, &guard));
        })
    });
    let addrs: Vec<IpAddr> = vec!["93.184.216.34".parse().expect("ip")];
    c.bench_function("policy_decide_with_guard", |b| {
        b.iter(|| {
            i = (i + 1) % targets.len();
            black_box(p.decide(black_box(&targets[i]), Some(&addrs), &guard));
        })
    });
}

/// 10,000 sandboxes of 6 entries each, as YAML.
fn many_sandboxes_yaml() -> String {
    let mut y = String::from("sandboxes:\n");
    for i in 0..10_000 {
        y.push_str(&format!(
            "  - id: sb{i}\n    sources: [10.{}.{}.0/24]\n    policy: {{ provider: local, config: {{}}, network: {{ egress: [\"api.example.com\", \"*.t{i}.example.net\", \"b-*.t{i}.example.org\", \"10.{}.0.0/16:5432\", \"x{i}.example.com:8000-8100\"], deny: [\"bad.t{i}.example.net\"] }} }}\n",
            i / 256 % 256, i % 256, i % 256
        ));
    }
    y
}

fn bench_compile(c: &mut Criterion) {
    let yaml = many_sandboxes_yaml();
    let config = load_str(&yaml, "bench.yaml", Path::new("."), None).expect("valid");
    let mut g = c.benchmark_group("policy_compile");
    g.sample_size(10);
    g.bench_function("compile_10k_sandboxes", |b| {
        b.iter(|| black_box(PolicySet::compile(&config, &[], vec![]).expect("compiles")))
    });
    g.bench_function("load_and_compile_10k_sandboxes_yaml", |b| {
        b.iter(|| {
            let c = load_str(black_box(&yaml), "bench.yaml", Path::new("."), None).expect("valid");
            black_box(PolicySet::compile(&c, &[], vec![]).expect("compiles"))
        })
    });
    g.finish();
}

/// Per-call latency percentiles (each call timed on its own).
fn percentiles() {
    let p = compiled();
    let guard = Guard::default();
    let targets = targets();
    let mut samples: Vec<Duration> = Vec::with_capacity(1_000_000);
    for round in 0..(1_000_000 / targets.len() + 1) {
        for t in &targets {
            let start = Instant::now();
            black_box(p.decide(black_box(t), None, &guard));
            let d = start.elapsed();
            if round > 0 {
                samples.push(d);
            }
        }
    }
    samples.sort_unstable();
    let q = |f: f64| samples[((samples.len() as f64 * f) as usize).min(samples.len() - 1)];
    println!(
        "policy_decide per-call over {} calls (10,000 entries, timer overhead included): p50 {:?}  p99 {:?}  p99.9 {:?}  max {:?}",
        samples.len(),
        q(0.50),
        q(0.99),
        q(0.999),
        samples[samples.len() - 1]
    );
}

/// A set with sandbox `a` holding `n` grants (`g0.example.com:443` …), the last one for
/// `wanted.example.com:443` when `wanted`.
fn granted_set(n: usize, wanted: bool) -> PolicySet {
    use egress_proxy::policy::granted::{GrantEntry, GrantKind, Granted};
    use egress_proxy::policy::sandbox_id::SandboxId;
    use std::sync::Arc;
    let yaml = "sandboxes:\n  - { id: a, policy: { provider: local, config: {}, network: { egress: [api.example.com, \"*.cdn.example.net\"], deny: [bad.example.com] } } }\n";
    let config = load_str(yaml, "bench.yaml", Path::new("."), None).expect("valid");
    let set = PolicySet::compile(&config, &[], vec![]).expect("compiles");
    let entries = (0..n)
        .map(|i| {
            let host = match (wanted, i + 1 == n) {
                (true, true) => "wanted.example.com".to_string(),
                _ => format!("g{i}.example.com"),
            };
            let t = Target::parse(&format!("{host}:443"), None).expect("valid");
            Arc::new(GrantEntry::new(
                "a",
                &format!("r-{i:012x}"),
                t.host,
                443,
                vec![],
                vec![],
                GrantKind::Ttl,
                Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
                "admin",
            ))
        })
        .collect();
    let mut edit = set.edit();
    edit.grants(&SandboxId::new("a").expect("id"), Granted { entries });
    edit.finish()
}

fn bench_grants(c: &mut Criterion) {
    let target = Target::parse("wanted.example.com:443", None).expect("valid");
    let addrs: Vec<IpAddr> = vec!["93.184.216.34".parse().expect("ip")];
    let mut g = c.benchmark_group("grants");
    for (name, n, wanted) in [
        ("none", 0, false),
        ("64_target_granted_last", 64, true),
        ("64_target_not_granted", 64, false),
    ] {
        let set = granted_set(n, wanted);
        let sb = set.get("a").expect("sandbox").clone();
        g.bench_function(name, |b| {
            b.iter(|| black_box(set.decide(&sb, black_box(&target), Some(&addrs))))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_decide, bench_compile, bench_grants);

fn main() {
    benches();
    percentiles();
    Criterion::default().configure_from_args().final_summary();
}
