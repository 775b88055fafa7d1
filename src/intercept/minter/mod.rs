//! Tokens the proxy mints for `oauth2` and `github_app` credentials, shared by every tunnel
//! of the process: one [`Slot`] per sandbox and credential (by its fingerprint, so a changed
//! secret or setting is a new slot), holding the token until shortly before it expires.
//!
//! **Single flight**: a slot's token is minted under the slot's lock, so however many
//! requests find it expired, one asks the endpoint and the others wait for its answer. A
//! refused mint is kept for [`RETRY_AFTER`], so waiting requests get the same refusal
//! (`credential_unavailable`) instead of asking again one by one.
//!
//! A policy that no longer has a credential drops its slot, and the token with it
//! ([`Minter::retain`], run on every publication).

mod fetch;
mod token_request;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::credential_kinds::Minting;
use crate::config::credentials::{Credential, CredentialKind, Secret};
use crate::egress::resolve::Resolver;
use crate::intercept::credential_error::{mint, CredentialError};
use crate::sandboxes::set::PolicySet;

/// How long a refused mint is answered from memory.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// How long minting may take, all included.
const MINT_WITHIN: Duration = Duration::from_secs(10);

/// Which slot: the sandbox and the credential's fingerprint.
type Key = (String, [u8; 32]);

/// The process's minted tokens.
pub struct Minter {
    slots: Mutex<HashMap<Key, Arc<Slot>>>,
    /// TLS toward token endpoints (the terminated upstreams' roots).
    tls: Arc<rustls::ClientConfig>,
    /// Bumped on every mint: scrubbers built before it do not know the new token.
    generation: AtomicU64,
    /// Requests sent to token endpoints (tests and metrics read it).
    pub mints: AtomicU64,
    /// Tokens a sandbox obtained itself, sealed ([`crate::intercept::sealed`]).
    pub sealed: crate::intercept::sealed::Sealed,
}

/// One credential's token of one sandbox.
pub struct Slot {
    minting: Arc<Minting>,
    state: tokio::sync::Mutex<State>,
    /// The token in force, for the scrubber (read without waiting).
    current: Mutex<Option<Secret>>,
}

#[derive(Default)]
struct State {
    token: Option<(Secret, Instant)>,
    /// A refresh token the endpoint rotated (else the one read from the file).
    refresh: Option<Secret>,
    failed: Option<(Instant, CredentialError)>,
}

/// When a token of `lifetime` is renewed: a minute before it ends, or a quarter of its
/// life before when it is short.
fn renew_at(now: Instant, lifetime: Duration) -> Instant {
    let margin = Duration::from_secs(60).min(lifetime / 4);
    now + lifetime.saturating_sub(margin)
}

impl Minter {
    /// A minter whose token endpoints are reached with `tls`.
    pub fn new(tls: Arc<rustls::ClientConfig>) -> Self {
        Minter {
            slots: Mutex::new(HashMap::new()),
            tls,
            generation: AtomicU64::new(0),
            mints: AtomicU64::new(0),
            sealed: Default::default(),
        }
    }

    /// The slot of `c` (a minting credential) for `sandbox`.
    pub fn slot(&self, sandbox: &str, c: &Credential, m: &Arc<Minting>) -> Arc<Slot> {
        let key = (sandbox.to_string(), c.fingerprint());
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        slots
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Slot {
                    minting: m.clone(),
                    state: tokio::sync::Mutex::new(State::default()),
                    current: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Drop the slots (and tokens) of credentials `set` no longer has.
    pub fn retain(&self, set: &PolicySet) {
        let mut slots = match self.slots.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        slots.retain(|(sandbox, fp), _| {
            set.get(sandbox).is_some_and(|sb| {
                sb.binding
                    .credentials
                    .iter()
                    .any(|c| matches!(c.kind, CredentialKind::Minted(_)) && c.fingerprint() == *fp)
            })
        });
    }

    /// Bumped on every mint.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A sandbox's own token answer with its tokens sealed (scrubbers learn of them).
    pub fn seal_answer(
        &self,
        sandbox: &str,
        credential: &str,
        body: &[u8],
    ) -> Result<bytes::Bytes, CredentialError> {
        let out = self.sealed.seal_answer(sandbox, credential, body);
        self.generation.fetch_add(1, Ordering::AcqRel);
        out
    }

    /// How many tokens are held now.
    pub fn held(&self) -> usize {
        self.slots.lock().map(|s| s.len()).unwrap_or_default()
    }
}

impl Slot {
    /// The token in force, minted now if there is none or it is about to expire (one mint
    /// however many wait); `Err` says why there is none.
    pub async fn token(
        &self,
        minter: &Minter,
        resolver: &Resolver,
    ) -> Result<Secret, CredentialError> {
        let mut st = self.state.lock().await;
        let now = Instant::now();
        if let Some((t, renew)) = &st.token {
            if now < *renew {
                return Ok(t.clone());
            }
        }
        if let Some((at, why)) = &st.failed {
            if now < *at + RETRY_AFTER {
                return Err(why.clone());
            }
        }
        let refresh = st
            .refresh
            .clone()
            .unwrap_or_else(|| self.minting.secret.clone());
        minter.mints.fetch_add(1, Ordering::Relaxed);
        match self.mint(minter, resolver, &refresh).await {
            Ok(m) => {
                st.failed = None;
                if m.refresh.is_some() {
                    st.refresh = m.refresh;
                }
                st.token = Some((m.token.clone(), renew_at(Instant::now(), m.lifetime)));
                if let Ok(mut c) = self.current.lock() {
                    *c = Some(m.token.clone());
                }
                minter.generation.fetch_add(1, Ordering::AcqRel);
                Ok(m.token)
            }
            Err(why) => {
                st.failed = Some((Instant::now(), why.clone()));
                Err(why)
            }
        }
    }

    async fn mint(
        &self,
        minter: &Minter,
        resolver: &Resolver,
        refresh: &Secret,
    ) -> Result<token_request::Minted, CredentialError> {
        let ask = token_request::ask(&self.minting, refresh)?;
        let url: http::Uri = self
            .minting
            .token_url()
            .parse()
            .map_err(|_| mint("the token URL is not a URL"))?;
        let answer = fetch::post(
            &minter.tls,
            resolver,
            &url,
            ask.headers,
            ask.body,
            MINT_WITHIN,
        )
        .await?;
        token_request::read(&self.minting, answer.status, &answer.body)
    }

    /// The token in force now, if any (for the scrubber).
    pub fn current(&self) -> Option<Secret> {
        self.current.lock().ok().and_then(|c| c.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_renewed_before_it_expires() {
        let now = Instant::now();
        assert_eq!(
            renew_at(now, Duration::from_secs(3600)),
            now + Duration::from_secs(3540)
        );
        assert_eq!(
            renew_at(now, Duration::from_secs(8)),
            now + Duration::from_secs(6)
        );
        assert_eq!(renew_at(now, Duration::ZERO), now);
    }
}
