//! Per-pod annotations that replace one value of the injection config each.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::config::{InjectionConfig, LOG_LEVELS};
use super::{CPU_LIMIT, CPU_REQUEST, IMAGE, LOG_LEVEL, MEMORY_LIMIT, MEMORY_REQUEST};

/// Per-pod values that replace the injection config's.
#[derive(Debug)]
pub(super) struct Overrides {
    pub(super) image: String,
    pub(super) log_level: String,
    pub(super) resources: Option<ResourceRequirements>,
}

impl Overrides {
    /// The overrides `annotations` ask for, or why one of them is invalid
    /// (naming the annotation).
    pub(super) fn from_annotations(
        annotations: &BTreeMap<String, String>,
        config: &InjectionConfig,
    ) -> Result<Overrides, String> {
        let mut resources = config.resources.clone();
        for (key, limit, resource) in [
            (CPU_REQUEST, false, "cpu"),
            (MEMORY_REQUEST, false, "memory"),
            (CPU_LIMIT, true, "cpu"),
            (MEMORY_LIMIT, true, "memory"),
        ] {
            let Some(value) = annotations.get(key) else {
                continue;
            };
            if !is_quantity(value) {
                return Err(format!(
                    "annotation {key}: {value:?} is not a Kubernetes quantity (e.g. 100m, 64Mi)"
                ));
            }
            let r = resources.get_or_insert_with(Default::default);
            let map = if limit {
                &mut r.limits
            } else {
                &mut r.requests
            };
            map.get_or_insert_with(BTreeMap::new)
                .insert(resource.into(), Quantity(value.clone()));
        }
        let log_level = match annotations.get(LOG_LEVEL) {
            Some(l) if LOG_LEVELS.contains(&l.as_str()) => l.clone(),
            Some(l) => {
                return Err(format!(
                    "annotation {LOG_LEVEL}: {l:?} is not one of {}",
                    LOG_LEVELS.join(", ")
                ))
            }
            None => config.log_level.clone(),
        };
        let image = match annotations.get(IMAGE) {
            Some(i) if !i.trim().is_empty() => i.clone(),
            Some(_) => return Err(format!("annotation {IMAGE}: must not be empty")),
            None => config.image.clone(),
        };
        Ok(Overrides {
            image,
            log_level,
            resources,
        })
    }
}

/// A Kubernetes resource quantity: a decimal number with an optional suffix.
fn is_quantity(s: &str) -> bool {
    const SUFFIXES: [&str; 14] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    !number.is_empty()
        && number.chars().filter(|&c| c == '.').count() <= 1
        && number != "."
        && SUFFIXES.contains(&suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for ok in ["1", "100m", "0.5", "64Mi", "1Gi", "2k"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "m", "1.2.3", "lots", "64MB", "-1", "."] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
