//! [`VecMap`]: a map kept as one sorted vector, for the few entries each control plane has per
//! member (its endpoints).
//!
//! A `BTreeMap` allocates a whole node for its first entry: eleven key and value slots, 540
//! bytes for `String -> String`, however few entries it holds. A ring keeps such a map for
//! every control plane, usually with one entry per member (three), so at 10,000 control planes
//! that is 5 MiB of empty slots on every member. A `VecMap` holds exactly its entries.
//!
//! It encodes exactly as a `BTreeMap` does (a map in key order), so what is stored or sent does
//! not change; decoding keeps the last of duplicate keys, as a `BTreeMap` does.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A map in key order, stored as a sorted vector of its entries: lookups are binary searches
/// and an insert moves the entries after it, which is right for a handful of entries.
#[derive(Clone, PartialEq, Eq)]
pub struct VecMap<K, V> {
    /// Sorted by key, keys unique.
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> VecMap<K, V> {
    /// An empty map (allocates nothing).
    pub fn new() -> Self {
        Self::default()
    }

    fn find<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    /// Whether `key` has a value.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value`; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                // Exactly one more: these maps stay small and live long.
                self.entries.reserve_exact(1);
                self.entries.insert(i, (key, value));
                None
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.find(key).ok()?;
        Some(self.entries.remove(i).1)
    }
}

impl<K, V> VecMap<K, V> {
    /// Keeps only the entries for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values, in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    /// Of duplicate keys, the last one's value is kept (as a `BTreeMap` does).
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // Stable: equal keys keep their order, so the last of them is the last in its run.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match kept.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => kept.push(entry),
            }
        }
        kept.shrink_to_fit();
        Self { entries: kept }
    }
}

impl<K, V> IntoIterator for VecMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for VecMap<K, V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for VecMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Serialize, V: Serialize> Serialize for VecMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for VecMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);

        impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for MapVisitor<K, V> {
            type Value = VecMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                // The size hint comes from the input: bounded, so a forged one reserves little.
                let mut entries = Vec::with_capacity(access.size_hint().unwrap_or(0).min(64));
                while let Some(entry) = access.next_entry()? {
                    entries.push(entry);
                }
                Ok(entries.into_iter().collect())
            }
        }

        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn pairs() -> Vec<(String, String)> {
        [("c", "3"), ("a", "1"), ("b", "2"), ("a", "last")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn behaves_like_a_btreemap() {
        let vec: VecMap<String, String> = pairs().into_iter().collect();
        let btree: BTreeMap<String, String> = pairs().into_iter().collect();
        assert_eq!(vec.len(), btree.len());
        assert!(
            vec.iter().eq(btree.iter()),
            "same entries in the same order"
        );
        assert_eq!(vec.get("a").map(String::as_str), Some("last"));
        assert!(vec.contains_key("b") && !vec.contains_key("z"));

        let mut vec = vec;
        let mut btree = btree;
        assert_eq!(
            vec.insert("ab".into(), "x".into()),
            btree.insert("ab".into(), "x".into())
        );
        assert_eq!(
            vec.insert("b".into(), "y".into()),
            btree.insert("b".into(), "y".into())
        );
        assert_eq!(vec.remove("c"), btree.remove("c"));
        assert_eq!(vec.remove("c"), None);
        assert!(vec.iter().eq(btree.iter()));
        assert!(vec.keys().eq(btree.keys()) && vec.values().eq(btree.values()));
        assert!(vec.clone().into_iter().eq(btree.clone()));
    }

    #[test]
    fn encodes_and_decodes_exactly_as_a_btreemap() {
        let vec: VecMap<String, String> = pairs().into_iter().collect();
        let btree: BTreeMap<String, String> = pairs().into_iter().collect();
        let json = serde_json::to_string(&vec).unwrap();
        assert_eq!(json, serde_json::to_string(&btree).unwrap());
        assert_eq!(json, r#"{"a":"last","b":"2","c":"3"}"#);
        let back: VecMap<String, String> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, vec);
        // Out of order and duplicated on the wire: sorted, the last value kept.
        let messy: VecMap<String, String> =
            serde_json::from_str(r#"{"b":"2","a":"1","a":"again"}"#).unwrap();
        assert_eq!(format!("{messy:?}"), r#"{"a": "again", "b": "2"}"#);
        assert!(serde_json::from_str::<VecMap<String, String>>("[1]").is_err());
        let empty: VecMap<String, String> = serde_json::from_str("{}").unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn holds_no_spare_room() {
        let vec: VecMap<String, String> = pairs().into_iter().collect();
        assert_eq!(vec.entries.capacity(), 3);
        let mut vec = vec;
        vec.insert("d".into(), "4".into());
        assert_eq!(vec.entries.capacity(), 4);
    }
}
