//! Checking the settings ([`Config::validate`], run before anything connects) and
//! reading them as the pool uses them (durations, the distributed profile).

use std::time::Duration;

use super::limits::COMPATIBILITY_DISTRIBUTED;
use super::rules::check_setting;
use super::{Config, CONNECTION_SETTINGS};
use crate::error::Result;

impl Config {
    /// Whether the distributed profile is on ([`Config::compatibility`]).
    pub fn distributed(&self) -> bool {
        self.compatibility == COMPATIBILITY_DISTRIBUTED
    }

    /// Whether the pool's own statements are named prepared statements: the
    /// `prepared_statements` setting, off under the distributed profile.
    pub fn named_statements(&self) -> bool {
        self.prepared_statements && !self.distributed()
    }

    /// Checks every value by its setting's rule ([`check_setting`]: one wording with
    /// the bindings' checks at assignment), then the URL and the connection fields (see
    /// [`Config::pg_config`]).
    ///
    /// Errors: [`Error::Config`](crate::error::Error::Config) naming the first bad setting.
    pub fn validate(&self) -> Result<()> {
        for name in CONNECTION_SETTINGS {
            check_setting(name, &self.value_of(name), None)?;
        }
        self.url_settings()?;
        self.pg_config().map(|_| ())
    }

    /// Seconds to establish a connection, as a `Duration`.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout)
    }

    /// The bound on the enqueue check ([`Config::enqueue_check_timeout`]).
    pub fn enqueue_check_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.enqueue_check_timeout)
    }

    /// The client-side bound on one call ([`Config::deadline`]), as a `Duration`.
    pub fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadline)
    }

    /// Seconds to wait for a pooled connection, as a `Duration`.
    pub fn checkout_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.checkout_timeout)
    }
}
