//! The memory options a worker is built with, validated at construction.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How often a running session's stores are synced (checked after each tool call).
pub(crate) const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(15);
/// The shortest sync interval: every sync lists every attached store.
pub(crate) const MIN_SYNC_INTERVAL: Duration = Duration::from_secs(5);
/// The longest sync interval (a day): longer is as good as `off`, and says so.
pub(crate) const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(24 * 3600);
/// The bound on each periodic sync after a tool call: a sync cut off there
/// lets the agent's next call go on, and the next sync picks up the rest.
pub(crate) const SYNC_BOUND: Duration = Duration::from_secs(30);
/// The bound on each teardown pass (the final sync, then the flush).
pub(crate) const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest memory teardown bound accepted (each of the final sync and the flush).
pub(crate) const MAX_TEARDOWN_BOUND: Duration = Duration::from_secs(3600);

/// Whether a file deleted locally may delete its memory on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeleteMode {
    /// Delete once a later sync confirms the file is still gone.
    #[default]
    Enabled,
    /// Run the same checks and only log what would be deleted.
    LogOnly,
    /// Never delete on the server.
    Disabled,
}

impl DeleteMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DeleteMode::Enabled => "enabled",
            DeleteMode::LogOnly => "log_only",
            DeleteMode::Disabled => "disabled",
        }
    }
}

impl fmt::Display for DeleteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeleteMode {
    type Err = OptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "enabled" => Ok(DeleteMode::Enabled),
            "log_only" => Ok(DeleteMode::LogOnly),
            "disabled" => Ok(DeleteMode::Disabled),
            other => Err(OptionError::DeleteMode(other.to_string())),
        }
    }
}

/// A refused option.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptionError {
    #[error(
        "memory sync interval must be at least {min}s (got {0}); to run without memory sync, turn it off",
        min = MIN_SYNC_INTERVAL.as_secs()
    )]
    IntervalTooShort(String),
    #[error(
        "memory sync interval must be at most {max}s (got {0}); to run without memory sync, turn it off",
        max = MAX_SYNC_INTERVAL.as_secs()
    )]
    IntervalTooLong(String),
    #[error("memory sync deletions must be enabled, log_only or disabled (got {0:?})")]
    DeleteMode(String),
    #[error("{0}")]
    Duration(String),
}

/// The sync cadence: off (no download, no sync) or every interval ≥ 5 s.
/// The field is private: an interval under the floor cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncInterval(Option<Duration>);

impl Default for SyncInterval {
    fn default() -> Self {
        SyncInterval(Some(DEFAULT_SYNC_INTERVAL))
    }
}

impl SyncInterval {
    /// No memory: nothing downloaded, nothing synced.
    pub const OFF: SyncInterval = SyncInterval(None);

    /// An interval, refused under the 5 s floor.
    pub fn every(interval: Duration) -> Result<SyncInterval, OptionError> {
        if interval < MIN_SYNC_INTERVAL {
            return Err(OptionError::IntervalTooShort(format!(
                "{}s",
                interval.as_secs_f64()
            )));
        }
        if interval > MAX_SYNC_INTERVAL {
            return Err(OptionError::IntervalTooLong(format!(
                "{}s",
                interval.as_secs_f64()
            )));
        }
        Ok(SyncInterval(Some(interval)))
    }

    /// Seconds as a float, as the Python SDK takes them: NaN, infinities and
    /// values under the floor are refused.
    pub fn from_secs_f64(secs: f64) -> Result<SyncInterval, OptionError> {
        // NaN compares as nothing, so it fails this check too.
        let at_least_floor = secs
            .partial_cmp(&MIN_SYNC_INTERVAL.as_secs_f64())
            .is_some_and(|o| o.is_ge());
        if !at_least_floor || !secs.is_finite() {
            return Err(OptionError::IntervalTooShort(format!("{secs}")));
        }
        if secs > MAX_SYNC_INTERVAL.as_secs_f64() {
            return Err(OptionError::IntervalTooLong(format!("{secs}")));
        }
        Ok(SyncInterval(Some(Duration::from_secs_f64(secs))))
    }

    pub(crate) fn interval(self) -> Option<Duration> {
        self.0
    }
}

impl FromStr for SyncInterval {
    type Err = OptionError;

    /// `off` (or `none`, `disabled`), or a duration: `15s`, `5`, `1m30s`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "off" | "none" | "disabled" => Ok(SyncInterval::OFF),
            other => SyncInterval::every(
                crate::duration::parse_duration(other).map_err(OptionError::Duration)?,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_floor_and_off() {
        assert_eq!(
            "15s".parse::<SyncInterval>().unwrap(),
            SyncInterval::every(Duration::from_secs(15)).unwrap()
        );
        assert_eq!(
            "5".parse::<SyncInterval>().unwrap(),
            SyncInterval::every(Duration::from_secs(5)).unwrap()
        );
        assert_eq!(
            "1m30s".parse::<SyncInterval>().unwrap(),
            SyncInterval::every(Duration::from_secs(90)).unwrap()
        );
        assert_eq!("off".parse::<SyncInterval>().unwrap(), SyncInterval::OFF);
        for bad in ["4s", "4999ms", "0", "soon", "-1"] {
            assert!(bad.parse::<SyncInterval>().is_err(), "{bad}");
        }
        for bad in [0.0, 4.999, -1.0, f64::NAN, f64::INFINITY] {
            assert!(SyncInterval::from_secs_f64(bad).is_err(), "{bad}");
        }
        assert!(SyncInterval::from_secs_f64(5.0).is_ok());
        let msg = SyncInterval::every(Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("at least 5s"), "{msg}");
    }

    #[test]
    fn delete_modes() {
        for m in [
            DeleteMode::Enabled,
            DeleteMode::LogOnly,
            DeleteMode::Disabled,
        ] {
            assert_eq!(m.as_str().parse::<DeleteMode>().unwrap(), m);
        }
        assert!("sometimes".parse::<DeleteMode>().is_err());
        assert_eq!(DeleteMode::default(), DeleteMode::Enabled);
    }
}
