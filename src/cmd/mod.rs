//! One module per subcommand: its arguments and its run. A command imports
//! no other command's code (`layers::ROOMS`); what they share is in
//! `session` (the traced run), `output`, `report` and `render`.

pub mod diff;
pub mod doctor;
pub mod generate;
pub mod leaks;
pub mod malloc;
pub mod record;
pub mod serve;
pub mod slab;
pub mod top;
