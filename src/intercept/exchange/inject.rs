//! The credentials of a terminated request, put on as it will be sent: each bound kind in
//! turn ([`crate::intercept::credential`]), the body read whole first when a kind signs over
//! it; a credential that cannot be had refuses the request (`credential_unavailable`).

use http::Request;
use http_body_util::BodyExt;

use super::{Prepared, Refusal, UpBody};
use crate::policy::reason::Reason;

impl Prepared {
    /// Put the credentials bound to this host on `req`, each by its kind (the body read whole
    /// first when one signs over it); the names of those used, or why one could not be had.
    pub(super) async fn inject(
        &self,
        req: &mut Request<UpBody>,
        limit: u64,
    ) -> Result<Option<String>, Refusal> {
        let whole = self
            .bound
            .iter()
            .any(|k| k.kind.reads_body(req.uri(), req.headers()));
        if whole {
            let body = std::mem::replace(req.body_mut(), UpBody::Whole(None));
            if !matches!(body, UpBody::Whole(_)) {
                let b = body;
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                let read = http_body_util::Limited::new(b, limit).collect().await;
                let bytes = read.map_err(|_| {
                    Refusal::new(
                        Reason::HttpNotAllowed,
                        format!("the body is signed over whole and is larger than {limit} bytes (tls_intercept.judge_body_bytes) or could not be read; send x-amz-content-sha256"),
                    )
                })?;
                *req.body_mut() = UpBody::whole(bytes.to_bytes());
            } else {
                *req.body_mut() = body;
            }
        }
        let mut used = Vec::new();
        for k in &self.bound {
            match k.kind.apply(req, &k.placeholder).await {
                Ok(true) => used.push(k.name.as_str()),
                Ok(false) => {}
                Err(why) => {
                    return Err(Refusal {
                        reason: Reason::CredentialUnavailable,
                        detail: format!("credential {}: {why}", k.name),
                        credential: Some(k.name.clone()),
                        shown: Some(format!("credential {}: {}", k.name, why.shown())),
                    })
                }
            }
        }
        Ok((!used.is_empty()).then(|| used.join(",")))
    }
}
