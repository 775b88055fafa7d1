//! Flow rules on what streams ([`super::flow`]): a [`Gate`] is one destination's judgement
//! of writes, owned by a long-lived exchange the proxy relays (an opaque tunnel, a WebSocket)
//! and re-asked when the sandbox's labels change; [`Gated`] is a request body watched the
//! same way as it streams.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::flow::{now_secs, Phase, Track};
use crate::policy::flows::state::FlowRefusal;
use crate::policy::flows::{Act, Dest, Flows};

/// One destination's flow gate, owned: what a long-lived exchange the proxy relays (an opaque
/// tunnel, a WebSocket) asks for each write, and watches for a label that refuses it.
#[derive(Debug, Clone)]
pub struct Gate {
    /// The sandbox's main track (every arming signals it).
    track: Arc<Track>,
    /// The other tracks its writes are judged with.
    others: Vec<Arc<Track>>,
    flows: Arc<Flows>,
    host: String,
    port: u16,
}

impl Gate {
    /// The gate of `phase`'s sandbox toward `host`:`port`.
    pub fn new(phase: &Phase<'_>, host: &str, port: u16) -> Gate {
        let (track, others) = phase.watched();
        Gate {
            track,
            others,
            flows: phase.flows.clone(),
            host: host.into(),
            port,
        }
    }

    /// Why a write now is refused (waivers honoured, not spent), if it is.
    pub fn write_refused(&self) -> Option<FlowRefusal> {
        let now = now_secs();
        let dest = Dest {
            host: &self.host,
            port: Some(self.port),
            request: None,
        };
        let mut labels = self.track.labels();
        let extra = self.others.iter().filter(|t| !Arc::ptr_eq(t, &self.track));
        labels.armed.extend(extra.flat_map(|t| t.labels().armed));
        labels.judge(&self.flows, &dest, Act::Write, now).err()
    }

    /// Resolves when a change of the sandbox's labels refuses writes through the gate.
    pub async fn refused(&self) -> FlowRefusal {
        let mut changed = self.track.changed();
        while changed.changed().await.is_ok() {
            if let Some(r) = self.write_refused() {
                return r;
            }
        }
        std::future::pending().await
    }
}

/// A request body watched by the sandbox's flow rules as it streams: a write allowed when it
/// began is cut (its next frame refused, nothing more sent) when a label armed meanwhile — by
/// another request — refuses it, so an upload held open cannot carry what the sandbox reads
/// after it started. The reason is left in `found` for the record.
pub struct Gated<B> {
    inner: B,
    gate: Gate,
    changed: watch::Receiver<()>,
    found: Arc<Mutex<super::dlp::Found>>,
}

impl<B> Gated<B> {
    /// `inner` watched through `gate`; a cut is noted in `found`.
    pub fn new(inner: B, gate: Gate, found: Arc<Mutex<super::dlp::Found>>) -> Self {
        let changed = gate.track.changed();
        Gated {
            inner,
            gate,
            changed,
            found,
        }
    }
}

impl<B> http_body::Body for Gated<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: From<super::dlp::Cut>,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        if self.changed.has_changed().unwrap_or(false) {
            self.changed.mark_unchanged();
            if let Some(r) = self.gate.write_refused() {
                if let Ok(mut f) = self.found.lock() {
                    f.flow = Some(r.detail);
                }
                let cut = super::dlp::Cut(super::dlp::DlpError::Flow);
                return std::task::Poll::Ready(Some(Err(cut.into())));
            }
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
