//! `kheap serve`'s parts below the command layer (its settings, daemon and
//! one read are in `cmd::serve`): cumulative series with bounded cardinality, the
//! metric families, their exposition formats, the pprof profiles, the
//! conditions it watches (`--snapshot-when`), and the HTTP server that
//! survives any client (listeners, web config, routes).

pub mod cgroups;
pub mod exposition;
pub mod families;
pub mod http;
pub mod listen;
pub mod processes;
pub mod profile;
pub mod routes;
pub mod series;
pub mod server;
pub mod triggers;
pub mod webconfig;
