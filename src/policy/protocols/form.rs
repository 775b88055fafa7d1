//! A method override in a form body (review round 7a B5): Rack's `MethodOverride` (the first
//! middleware of every Rails app), Laravel and Symfony read a POST whose form body carries a
//! `_method` field as that method — a `POST` the rules allowed runs as the `DELETE` they
//! refused. On a host whose rules name methods, the body of a POST sent as a form
//! (`application/x-www-form-urlencoded`) or as `multipart/form-data` is read and refused when a
//! field is named `_method` (any case, percent-encoded or not, in a part's `name` or
//! `name*`). A multipart body the proxy cannot split into parts is refused too: what is not
//! read is not passed.

/// The field the frameworks read.
const FIELD: &str = "_method";

/// Which form encoding a `Content-Type` names, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    /// `application/x-www-form-urlencoded`.
    UrlEncoded,
    /// `multipart/form-data` with its boundary (`None`: the type named none).
    Multipart(Option<String>),
}

impl Form {
    /// The form encoding `content_type` names (media type any case), if any.
    pub fn of(content_type: &str) -> Option<Form> {
        let mut parts = content_type.split(';');
        let media = parts.next().unwrap_or("").trim();
        if media.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            return Some(Form::UrlEncoded);
        }
        if !media.eq_ignore_ascii_case("multipart/form-data") {
            return None;
        }
        let boundary = parts.find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("boundary")
                .then(|| v.trim().trim_matches('"').to_string())
        });
        Some(Form::Multipart(boundary.filter(|b| !b.is_empty())))
    }
}

/// Why `body`, a form of kind `form`, is refused: a `_method` field, or a multipart body that
/// does not split into parts.
pub fn override_refusal(form: &Form, body: &[u8]) -> Option<String> {
    match form {
        Form::UrlEncoded => form_urlencoded::parse(body)
            .any(|(k, _)| k.eq_ignore_ascii_case(FIELD))
            .then(|| refusal("form")),
        Form::Multipart(None) => Some("a multipart body without a boundary cannot be read for a method override; refused on a host whose rules name methods".into()),
        Form::Multipart(Some(boundary)) => multipart(body, boundary),
    }
}

/// The form reader as a plug-in: not written in rules, judged on a POST form body on a host
/// whose rules name methods.
impl super::plugin::BodyRule for Form {
    fn name(&self) -> &'static str {
        "form"
    }

    fn describe(&self) -> String {
        "form:_method".into()
    }

    fn reason(&self) -> crate::policy::reason::Reason {
        crate::policy::reason::Reason::HttpNotAllowed
    }

    fn carries(&self, method: &str) -> bool {
        method.eq_ignore_ascii_case("POST")
    }

    fn judge(
        &self,
        _: super::Asked<'_>,
        body: &[u8],
    ) -> Result<super::BodyVerdict, super::RefusedCall> {
        match override_refusal(self, body) {
            None => Ok(super::BodyVerdict::default()),
            Some(why) => Err(super::plugin::refused(self, why, None, None)),
        }
    }
}

fn refusal(what: &str) -> String {
    format!(
        "a `_method` field in the {what} body would make the upstream (Rack, Laravel, Symfony) run another method than the rules judged; refused on a host whose rules name methods"
    )
}

/// Each part's `Content-Disposition` names, read as RFC 7578 writes them.
fn multipart(body: &[u8], boundary: &str) -> Option<String> {
    let delimiter = format!("--{boundary}");
    let unreadable = || {
        Some("a multipart body that does not split into parts by its boundary cannot be read for a method override; refused on a host whose rules name methods".to_string())
    };
    let mut pieces = split(body, delimiter.as_bytes());
    // Before the first delimiter: a preamble, ignored by every parser.
    pieces.next();
    let mut closed = false;
    for piece in pieces {
        if piece.starts_with(b"--") {
            closed = true;
            break;
        }
        let Some(piece) = piece
            .strip_prefix(b"\r\n")
            .or_else(|| piece.strip_prefix(b"\n"))
        else {
            return unreadable();
        };
        let end = find(piece, b"\r\n\r\n")
            .or_else(|| find(piece, b"\n\n"))
            .unwrap_or(piece.len());
        let headers = String::from_utf8_lossy(&piece[..end]);
        for line in headers.lines() {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("content-disposition") && names_field(value) {
                return Some(refusal("multipart"));
            }
        }
    }
    match closed {
        true => None,
        false => unreadable(),
    }
}

/// Whether a `Content-Disposition` value's `name` (or `name*`, RFC 5987) is the field.
fn names_field(value: &str) -> bool {
    value.split(';').skip(1).any(|param| {
        let Some((k, v)) = param.split_once('=') else {
            return false;
        };
        let k = k.trim();
        let v = v.trim().trim_matches('"');
        if k.eq_ignore_ascii_case("name") {
            return decoded_is_field(v);
        }
        if k.eq_ignore_ascii_case("name*") {
            // charset'language'percent-encoded
            let encoded = v.rsplit('\'').next().unwrap_or(v);
            return decoded_is_field(encoded);
        }
        false
    })
}

fn decoded_is_field(raw: &str) -> bool {
    crate::policy::http_rules::percent_decode(raw).eq_ignore_ascii_case(FIELD.as_bytes())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `body` split at every occurrence of `delimiter`.
fn split<'a>(body: &'a [u8], delimiter: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = Some(body);
    std::iter::from_fn(move || {
        let r = rest?;
        match find(r, delimiter) {
            Some(i) => {
                rest = Some(&r[i + delimiter.len()..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_field_in_a_form_is_refused_in_every_spelling() {
        let form = Form::of("application/x-www-form-urlencoded; charset=utf-8").unwrap();
        for body in [
            &b"_method=DELETE"[..],
            b"a=1&_method=delete",
            b"a=1&%5Fmethod=DELETE",
            b"a=1&_METHOD=PUT",
            b"_method",
        ] {
            assert!(override_refusal(&form, body).is_some(), "{body:?}");
        }
        for body in [&b"a=1&method=DELETE"[..], b"my_method=1", b"x=_method", b""] {
            assert_eq!(override_refusal(&form, body), None, "{body:?}");
        }
    }

    #[test]
    fn a_method_part_in_multipart_is_refused_and_an_unsplittable_body_too() {
        let form = Form::of("Multipart/Form-Data; boundary=\"XyZ\"").unwrap();
        assert_eq!(form, Form::Multipart(Some("XyZ".into())));
        let body = |name: &str| {
            format!("--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--XyZ\r\nContent-Disposition: form-data; {name}\r\n\r\nDELETE\r\n--XyZ--\r\n")
        };
        for name in [
            "name=\"_method\"",
            "name=_method",
            "name=\"%5Fmethod\"",
            "name*=UTF-8''%5fmethod",
        ] {
            assert!(
                override_refusal(&form, body(name).as_bytes()).is_some(),
                "{name}"
            );
        }
        assert_eq!(
            override_refusal(&form, body("name=\"method\"").as_bytes()),
            None
        );
        // Not closed, no boundary, no parts: not read, refused.
        assert!(override_refusal(
            &form,
            b"--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\n1"
        )
        .is_some());
        assert!(override_refusal(&Form::Multipart(None), b"").is_some());
        assert!(Form::of("application/json").is_none());
    }
}
