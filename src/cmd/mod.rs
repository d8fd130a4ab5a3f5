//! One module per subcommand.

pub mod doctor;
pub mod malloc;
pub mod record;
pub mod slab;
pub mod top;
