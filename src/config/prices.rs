//! `defaults.prices`: what a model's tokens cost, for `limits.cost_per_day`. Written by the
//! operator, in dollars per million tokens of each kind, first matching `models` glob wins; no
//! price ships with the proxy (a built-in table would go stale silently). A call under a cost
//! budget whose model no entry prices is refused (`budget_exceeded`); a `models: "*"` entry
//! last is the operator's chosen default.

use serde::{Deserialize, Serialize};

/// One `defaults.prices` entry: dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// The models it prices (a glob: `gpt-4o-mini*`, `claude-*`, `*`).
    pub models: String,
    /// Input tokens not read from a cache.
    pub input: f64,
    /// Output tokens (reasoning tokens included, as the providers bill them).
    pub output: f64,
    /// Input tokens read from the provider's cache (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Input tokens written to the provider's cache (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

pub use crate::policy::protocols::inference_usage::TokenKinds;

impl Price {
    /// Whether this entry prices `model`.
    pub fn prices(&self, model: &str) -> bool {
        globset::Glob::new(&self.models).is_ok_and(|g| g.compile_matcher().is_match(model))
    }

    /// What `t` costs, in nano-dollars (rounded).
    pub fn cost(&self, t: &TokenKinds) -> u64 {
        let per = |n: u64, dollars_per_million: f64| n as f64 * dollars_per_million * 1e3;
        let nano = per(t.input, self.input)
            + per(t.cached_input, self.cached_input.unwrap_or(self.input))
            + per(t.cache_write, self.cache_write.unwrap_or(self.input))
            + per(t.output, self.output);
        nano.round().clamp(0.0, u64::MAX as f64) as u64
    }
}

/// The first entry of `prices` that prices `model`.
pub fn find<'a>(prices: &'a [Price], model: &str) -> Option<&'a Price> {
    prices.iter().find(|p| p.prices(model))
}

/// What is wrong with `prices`, if anything (the field path and why).
pub fn check(prices: &[Price]) -> Result<(), (String, String)> {
    for (i, p) in prices.iter().enumerate() {
        let at = format!("defaults.prices[{i}]");
        if let Err(e) = globset::Glob::new(&p.models) {
            return Err((format!("{at}.models"), e.to_string()));
        }
        for (k, v) in [
            ("input", Some(p.input)),
            ("output", Some(p.output)),
            ("cached_input", p.cached_input),
            ("cache_write", p.cache_write),
        ] {
            if v.is_some_and(|v| !v.is_finite() || !(0.0..=1e6).contains(&v)) {
                return Err((
                    format!("{at}.{k}"),
                    "a price is dollars per million tokens, between 0 and 1,000,000".into(),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_entry_prices_each_kind() {
        let prices = vec![
            Price {
                models: "gpt-4o-mini*".into(),
                input: 0.15,
                output: 0.6,
                cached_input: Some(0.075),
                cache_write: None,
            },
            Price {
                models: "*".into(),
                input: 10.0,
                output: 30.0,
                cached_input: None,
                cache_write: None,
            },
        ];
        let p = find(&prices, "gpt-4o-mini-2024-07-18").unwrap();
        let t = TokenKinds {
            input: 1_000_000,
            cached_input: 1_000_000,
            cache_write: 0,
            output: 1_000_000,
        };
        // $0.15 + $0.075 + $0.60
        assert_eq!(p.cost(&t), 825_000_000);
        assert_eq!(find(&prices, "o3").unwrap().input, 10.0);
        assert!(find(&prices[..1], "o3").is_none());
        assert!(check(&prices).is_ok());
        let mut bad = prices.clone();
        bad[0].output = f64::NAN;
        assert!(check(&bad).unwrap_err().0.ends_with("output"));
        bad[0].output = -1.0;
        assert!(check(&bad).is_err());
    }
}
