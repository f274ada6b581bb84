pub mod claim;
pub mod config;
pub mod error;
pub mod migrate;
pub mod store;
