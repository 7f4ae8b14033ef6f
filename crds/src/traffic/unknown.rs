//! Fields of a report line this build does not know: a newer sidecar's
//! (route ids, observe-mode counts). They are read past without keeping
//! their values, and only how many there were is kept, so a line never
//! costs more memory for its unknown fields than their count, and an older
//! controller never cuts a newer sidecar's stream for them.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// How many fields a report (or one policy's counts) carried that this
/// build does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnknownFields(pub u64);

impl<'de> Deserialize<'de> for UnknownFields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = UnknownFields;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("fields")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut n = 0u64;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(UnknownFields(n))
            }
        }
        d.deserialize_map(Count)
    }
}
