//! What the limiter costs: admitting a connection (slot + rate token, then release) and
//! shaping one 16 KiB chunk of a tunnel. Run: `cargo bench --bench limits`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use egress_proxy::config::Limits;
use egress_proxy::egress::limits::{Limiters, TokenBucket};

fn limits(bw: Option<u64>) -> Limits {
    Limits {
        max_connections: u32::MAX,
        connections_per_second: 1e12,
        burst: u32::MAX,
        bandwidth_up_bps: bw,
        bandwidth_down_bps: bw,
        dns_queries_per_second: 1e12,
        socket_buffer_bytes: None,
        bytes_per_day: None,
        requests_per_day: None,
        per_destination: Vec::new(),
        tokens_per_day: None,
        cost_per_day: None,
        per_process: None,
        prices: Vec::new(),
    }
}

fn bench(c: &mut Criterion) {
    let reg = Limiters::default();
    let l = reg.get("bench", &limits(None));
    c.bench_function("limits/admit_and_release", |b| {
        b.iter(|| black_box(l.take_slot(reg.now()).ok()));
    });
    c.bench_function("limits/registry_get_and_admit", |b| {
        let lim = limits(None);
        b.iter(|| black_box(reg.get("bench", &lim).take_slot(reg.now()).ok()));
    });
    let shaped = reg.get("shaped", &limits(Some(u64::MAX / 4)));
    c.bench_function("limits/shape_16k_chunk", |b| {
        b.iter(|| black_box(shaped.shape_now(false, 16 * 1024)));
    });
    let mut bucket = TokenBucket::new(1e9, 1e9, 0);
    let mut now = 0u64;
    c.bench_function("limits/token_bucket_check", |b| {
        b.iter(|| {
            now += 1000;
            black_box(bucket.check(now, 1.0))
        });
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
