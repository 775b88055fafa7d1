//! A read-only map from names to values that costs little when small: most sandboxes have a
//! handful of rules, and a hash table's smallest allocation (plus its hasher state) was most
//! of what a compiled sandbox weighed. Up to [`FEW`] entries are a boxed slice scanned in
//! order; more are a boxed, exactly-sized hash map.

use std::collections::HashMap;

/// Entries up to which a scan beats hashing the name.
const FEW: usize = 8;

#[derive(Debug)]
pub enum CompactMap<V> {
    Few(Box<[(Box<str>, V)]>),
    /// Boxed on purpose: the enum stays three words, the size of the `Few` arm, instead of a
    /// hash map's six in every (mostly small) compiled rule list.
    #[allow(clippy::box_collection)]
    Many(Box<HashMap<Box<str>, V>>),
}

impl<V> Default for CompactMap<V> {
    fn default() -> Self {
        CompactMap::Few(Box::new([]))
    }
}

impl<V> From<HashMap<Box<str>, V>> for CompactMap<V> {
    fn from(mut map: HashMap<Box<str>, V>) -> Self {
        if map.len() <= FEW {
            CompactMap::Few(map.into_iter().collect())
        } else {
            map.shrink_to_fit();
            CompactMap::Many(Box::new(map))
        }
    }
}

impl<V> CompactMap<V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        match self {
            CompactMap::Few(entries) => entries.iter().find(|(k, _)| &**k == key).map(|(_, v)| v),
            CompactMap::Many(map) => map.get(key),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            CompactMap::Few(entries) => entries.is_empty(),
            CompactMap::Many(map) => map.is_empty(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_maps_find_the_same() {
        for n in [0usize, 1, FEW, FEW + 1, 100] {
            let map: HashMap<Box<str>, usize> =
                (0..n).map(|i| (format!("k{i}").into(), i)).collect();
            let compact = CompactMap::from(map);
            assert_eq!(compact.is_empty(), n == 0);
            assert!(matches!(compact, CompactMap::Few(_)) == (n <= FEW));
            for i in 0..n {
                assert_eq!(compact.get(&format!("k{i}")), Some(&i));
            }
            assert_eq!(compact.get("k"), None);
            assert_eq!(compact.get(&format!("k{n}")), None);
        }
    }
}
