//! One module per subcommand.

pub mod doctor;
pub mod record;
pub mod top;
