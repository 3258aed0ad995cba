//! The configuration file (`ring0.toml`) of ring0, and the kernel it builds.
//!
//! Every front end of ring0 (the `ring0` binary, an HTTP agent API, a Python package) loads the
//! same file through this crate, so each refuses the same invalid file with the same message:
//!
//! - [`schema`]: every section and key, its default and its documentation ([`Config`]), and the
//!   embedded defaults ([`DEFAULT_CONFIG`]) used when no file exists.
//! - [`load`]: parsing with errors named by key ([`ConfigError`]), checking every value, and
//!   resolving the workspace, the state directory and ring0's protected paths ([`Loaded`]).
//! - [`sandbox`]: `[sandbox]`, the OS sandbox's profiles and which one each tool and upstream
//!   runs in.
//! - [`state`]: the state directory — where it is, how it is created private, and the manifest
//!   that refuses a journal or audit log replaced or truncated behind ring0's back.
//! - [`report`]: what a configuration does to a catalog, said at start: the grants in effect,
//!   every tool hidden from every principal with the reason, every grant that names no tool.
//! - [`init`]: a commented `ring0.toml` for a workspace, with the MCP servers found in the
//!   configuration files of common clients written out as commented `[[upstreams]]`.
//! - [`build`]: the built-in tools, the SQLite journal and the session's policy ([`Parts`]), and
//!   a kernel assembled from them ([`Built`]).
//!
//! ```
//! let config = ring0_config::Config::parse(
//!     "[limits]\nmax_concurrent_tools = 4\n",
//!     "example.toml",
//! )
//! .unwrap();
//! assert_eq!(config.limits.max_concurrent_tools, 4);
//!
//! let err = ring0_config::Config::parse("[limits]\nsesion_rate = \"1/s\"\n", "example.toml")
//!     .unwrap_err();
//! assert!(err.key.starts_with("limits.sesion_rate"));
//! ```

#![deny(missing_docs)]

pub mod build;
pub mod egress;
pub mod init;
pub mod load;
pub mod report;
pub mod sandbox;
pub mod schema;
pub mod state;

pub use build::{
    Built, Checked, Parts, SharedJournal, build_kernel, build_kernel_tapped, build_parts,
    build_parts_tapped, check,
};
pub use load::{Loaded, approvals_dir, read_bounded};
/// Ends a client session's background jobs (see [`Built::jobs`]).
pub use ring0_tools::JobSessions;
pub use schema::{
    ApprovalSection, AuditSection, CONFIG_BYTES_MAX, CONFIG_FILE_DEFAULT, Config, ConfigError,
    DEFAULT_CONFIG, GrantSection, LimitsSection, PathsSection, ShellSection, WorkspaceSection,
};
