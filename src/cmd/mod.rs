//! One module per subcommand.

pub mod diff;
pub mod doctor;
pub mod generate;
pub mod help;
pub mod leaks;
pub mod malloc;
pub mod progress;
pub mod record;
pub mod run;
pub mod serve;
pub mod slab;
pub mod top;
