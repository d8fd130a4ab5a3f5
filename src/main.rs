// TEMPORARY (branch slab): skel, model and the slab API are not used by a
// main yet; the main developer's wiring removes the need for these allows.
#[allow(dead_code, unused_imports)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/kheap.skel.rs"));
}
#[allow(dead_code)]
mod model;
#[allow(dead_code, unused_imports)]
mod slab;
fn main() {}
