//! Bar charts as SVG, drawn by the server: one bar per day or minute, each with its number
//! written beside it (and on the bar's `data-value`, for whoever reads the page by machine),
//! and a dashed line where a quota stands. No script, no style: presentation attributes only,
//! which the console's Content-Security-Policy allows.

use maud::{html, Markup};

/// One bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bar {
    /// Under the bar (a day, a minute).
    pub label: String,
    /// Its height.
    pub value: u64,
}

const WIDTH: u64 = 640;
const HEIGHT: u64 = 160;
const TOP: u64 = 18;
const BOTTOM: u64 = 22;

/// A chart of `bars` named `title` (its `id` is `chart-{id}`), with `limit` drawn as a line
/// when there is one; `labels` writes each bar's number above it (few bars only).
pub fn bars(id: &str, title: &str, bars: &[Bar], limit: Option<u64>, labels: bool) -> Markup {
    let top = bars
        .iter()
        .map(|b| b.value)
        .chain(limit)
        .max()
        .unwrap_or(0)
        .max(1);
    let plot = HEIGHT - TOP - BOTTOM;
    let n = bars.len().max(1) as u64;
    let slot = WIDTH / n;
    let bar_w = (slot * 7 / 10).max(1);
    let y_of = |v: u64| TOP + plot - (v.min(top) * plot) / top;
    html! {
        figure.chart id=(format!("chart-{id}")) {
            figcaption { (title) }
            svg xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {WIDTH} {HEIGHT}"))
                role="img" aria-label=(title) {
                line x1="0" x2=(WIDTH) y1=(TOP + plot) y2=(TOP + plot) stroke="#888" {}
                @for (i, b) in bars.iter().enumerate() {
                    @let x = i as u64 * slot + (slot - bar_w) / 2;
                    @let y = y_of(b.value);
                    rect.bar x=(x) y=(y) width=(bar_w) height=(TOP + plot - y) fill="#3b6ea5"
                        data-label=(b.label) data-value=(b.value) {
                        title { (b.label) ": " (b.value) }
                    }
                    @if labels {
                        text x=(x + bar_w / 2) y=(y.saturating_sub(4).max(10)) font-size="11"
                            text-anchor="middle" { (b.value) }
                        text x=(x + bar_w / 2) y=(HEIGHT - 6) font-size="11" text-anchor="middle" {
                            (b.label)
                        }
                    }
                }
                @if let Some(l) = limit {
                    line.limit x1="0" x2=(WIDTH) y1=(y_of(l)) y2=(y_of(l)) stroke="#b03030"
                        stroke-dasharray="6 4" data-value=(l) {}
                    text x=(WIDTH - 4) y=(y_of(l).saturating_sub(3).max(10)) font-size="11"
                        text-anchor="end" fill="#b03030" { "quota " (l) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_carry_their_numbers_and_a_quota_line() {
        let b = vec![
            Bar {
                label: "11-27".into(),
                value: 3,
            },
            Bar {
                label: "<b>".into(),
                value: 12,
            },
        ];
        let svg = bars("requests", "Requests <per day>", &b, Some(10), true).into_string();
        assert!(svg.contains(r#"data-value="12""#), "{svg}");
        assert!(svg.contains("quota 10"), "{svg}");
        assert!(
            svg.contains("&lt;b&gt;") && !svg.contains("<b>"),
            "escaped: {svg}"
        );
        assert!(svg.contains("Requests &lt;per day&gt;"), "{svg}");
        // Nothing drawn outside the picture, an empty chart included.
        assert!(!svg.contains("y=\"-"), "{svg}");
        let empty = bars("x", "x", &[], None, false).into_string();
        assert!(empty.contains("<svg"), "{empty}");
    }
}
