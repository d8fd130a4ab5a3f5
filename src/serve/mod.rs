//! `kheap serve`'s parts: its settings and config file, the daemon that
//! attaches, reads and reloads, cumulative series with bounded cardinality, the
//! metric families, their exposition formats, the pprof profiles, the
//! conditions it watches (`--snapshot-when`), and the HTTP server that
//! survives any client (listeners, web config, routes).

pub mod cgroups;
pub mod daemon;
pub mod exposition;
pub mod families;
pub mod http;
pub mod listen;
pub mod profile;
pub mod publish;
pub mod routes;
pub mod series;
pub mod server;
pub mod settings;
pub mod triggers;
pub mod webconfig;
