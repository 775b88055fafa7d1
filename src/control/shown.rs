//! Text a sandbox wrote (an access request's reason, a note, a refusal's detail) as a person
//! is shown it by the CLI and `observe`: characters that change how text *looks* rather than
//! what it says — bidirectional overrides and isolates, line and paragraph separators,
//! zero-width characters, other control characters — are written as escapes, so a reason
//! cannot reorder or hide what the approver reads. Records keep the text verbatim.

use std::borrow::Cow;

/// Whether `c` changes how the text around it is shown.
pub fn deceptive(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    ) || c.is_control()
}

/// `text` for a person: each deceptive character as `\u{XXXX}`.
pub fn for_person(text: &str) -> Cow<'_, str> {
    escaped(text, |c| format!("\\u{{{:04x}}}", u32::from(c)))
}

/// A JSON document for a person: each deceptive character inside its strings as `\uXXXX`,
/// so it still parses to the same values (JSON's own line ends and indentation stay).
pub fn json_for_person(json: &str) -> Cow<'_, str> {
    escaped(json, |c| match c {
        '\n' | '\t' | '\r' => c.to_string(),
        c => format!("\\u{:04x}", u32::from(c)),
    })
}

fn escaped(text: &str, esc: impl Fn(char) -> String) -> Cow<'_, str> {
    if !text.chars().any(deceptive) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match deceptive(c) {
            true => out.push_str(&esc(c)),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_characters_are_shown_as_escapes() {
        let reason = "pay \u{202e}txt.exe\u{202c} now\u{2028}approved\u{200b}!\u{2066}x\u{2069}";
        let shown = for_person(reason);
        assert!(!shown.chars().any(deceptive), "{shown}");
        assert!(
            shown.contains("\\u{202e}") && shown.contains("\\u{2028}"),
            "{shown}"
        );
        assert_eq!(for_person("plain text"), "plain text");
    }

    #[test]
    fn json_stays_json_with_the_same_values() {
        let v = serde_json::json!({ "reason": "a\u{202e}b\u{2028}c\u{200d}" });
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let shown = json_for_person(&pretty);
        assert!(
            !shown.contains('\u{202e}') && !shown.contains('\u{2028}'),
            "{shown}"
        );
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, v);
    }
}
