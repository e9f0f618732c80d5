//! Configuration errors: each names the resource, the field path inside it and the reason, and
//! every error of a snapshot is reported at once (no fix-one-rerun loop).

use std::fmt;

/// One problem in one resource.
///
/// Displayed as `resource: field: reason`, leaving out an empty part, e.g.
/// `cluster "main": shards[1].endpoints[0].address: invalid socket address "127.0.0.1:99999"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The resource at fault: `listener "main"`, `cluster "cache"`,
    /// `cluster_load_assignment "cache"`, `listeners[2]` when it has no usable name, or empty
    /// for the document itself. [`load_file`](crate::load_file) puts the file path in front.
    pub resource: String,
    /// Path of the field inside the resource, in the source's own terms: YAML keys for a YAML
    /// file (`shards[1].endpoints[0].address`), Envoy v3 field names for xDS resources
    /// (`endpoints[0].lb_endpoints[1].endpoint.address`). Empty when the whole resource is meant.
    pub field: String,
    /// What is wrong, in words.
    pub reason: String,
}

impl ConfigError {
    /// An error in `field` of `resource`.
    pub fn new(
        resource: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError {
            resource: resource.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.resource.is_empty() {
            write!(f, "{}: ", self.resource)?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Every error found in one configuration snapshot, in source order.
///
/// Displayed one error per line. Never empty when returned as an `Err`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// These errors of the file `file`: each resource starts with the file's path
    /// (`respway.yaml: cluster "main"`, or the path alone).
    pub(crate) fn in_file(self, file: &str) -> ConfigErrors {
        ConfigErrors(
            self.0
                .into_iter()
                .map(|mut e| {
                    e.resource = if e.resource.is_empty() {
                        file.to_string()
                    } else {
                        format!("{file}: {}", e.resource)
                    };
                    e
                })
                .collect(),
        )
    }

    /// The errors, in source order.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    /// How many errors there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is no error (never the case for a returned `Err`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Collects errors while a source is walked; the current resource is set as the walk enters it.
#[derive(Debug, Default)]
pub(crate) struct Cx {
    /// Errors so far.
    pub(crate) errors: Vec<ConfigError>,
    /// The resource that errors are reported against.
    pub(crate) resource: String,
}

impl Cx {
    /// Records an error in `field` of the current resource.
    pub(crate) fn err(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.errors.push(ConfigError {
            resource: self.resource.clone(),
            field: field.into(),
            reason: reason.into(),
        });
    }

    /// How many errors so far; compare before and after a step to know whether it failed.
    pub(crate) fn count(&self) -> usize {
        self.errors.len()
    }

    /// `Ok(value)` when no error was recorded, else every error.
    pub(crate) fn finish<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }
}

/// `parent.key`, or `key` at the root.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// `parent[index]`.
pub(crate) fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_skips_empty_parts() {
        assert_eq!(ConfigError::new("a", "b", "c").to_string(), "a: b: c");
        assert_eq!(ConfigError::new("", "b", "c").to_string(), "b: c");
        assert_eq!(ConfigError::new("a", "", "c").to_string(), "a: c");
        assert_eq!(ConfigError::new("", "", "c").to_string(), "c");
        let all = ConfigErrors(vec![
            ConfigError::new("a", "b", "c"),
            ConfigError::new("d", "", "e"),
        ]);
        assert_eq!(all.to_string(), "a: b: c\nd: e");
    }
}
